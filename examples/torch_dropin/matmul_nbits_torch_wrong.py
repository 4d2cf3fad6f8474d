"""WRONG TWIN of matmul_nbits_torch.py, for showing what the suite reports: the same drop-in with
ONE broken rule: the default zero point (no zero_points given) is taken as 8 for every bit width,
where MatMulNBits says 2^(bits-1) (2, 4, 8 or 128). For 4-bit weights the two agree, so only the
2-, 3- and 8-bit leaves fail, and only their cases without zero points::

    qconform run --ops matmul_nbits --leaf Xfp16_Wu2_Yfp16 \
      --impl py:examples/torch_dropin/matmul_nbits_torch_wrong.py:matmul_nbits

fails matches_oracle (relL2 far above the bound, and the output with the largest error).

It loads a private copy of the correct module and changes that one function in the copy, so the
correct module, if loaded in the same process, is untouched.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "matmul_nbits_torch_wrong_copy", Path(__file__).with_name("matmul_nbits_torch.py")
)
assert _spec is not None and _spec.loader is not None
_copy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_copy)


def default_zero_point(bits: int) -> int:
    return 8  # BUG: 8 is 2^(bits-1) for bits = 4 only


_copy.default_zero_point = default_zero_point
dequantize = _copy.dequantize
NumpyOps = _copy.NumpyOps
matmul_nbits = _copy.matmul_nbits  # carries __qconform_device__ and __qconform_ops__
