"""qconform: bit-exact oracles and a property engine for quantized LLM inference kernels."""

from qconform.errors import ArgumentError, Declined, DeviceError

__version__ = "0.1.0"

__all__ = ["ArgumentError", "Declined", "DeviceError", "__version__"]
