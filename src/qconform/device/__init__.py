"""The device backend: kernels in ``kernels/*.hip`` (one source for HIP and CUDA through
``qk_portable.h``), compiled by CuPy RawModule (hiprtc on ROCm, NVRTC on NVIDIA), launched through
one ABI per op, checked by the same suite as every other implementation.

``registry`` (the kernels and their launch geometry) imports no CuPy; ``loader``, ``launch``,
``errstate`` and ``impls`` need CuPy and a device. Public launchers: ``qconform.device.launch``
``quantize(x, qtype, out=..., variant=..., stream=...)`` and ``dequantize(...)``, the oracle's
call shape on CuPy arrays.
"""
