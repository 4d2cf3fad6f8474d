"""The argument validators a drop-in can call to reject bad calls as qconform's oracles do: each
raises ``qconform.ArgumentError("<argument>: <rule>")`` (a ValueError) naming the argument and
the rule, before anything is written. The same functions the oracles run (docs/user-kernels.md,
"Validating arguments")."""

from qconform.oracles.ggml import check_dequantize_args, check_quantize_args
from qconform.oracles.ort import (
    check_a,
    check_activations,
    check_fake_quantize_args,
    check_gather_args,
    check_nbits_args,
    check_out,
    check_qparams,
)

__all__ = [
    "check_a",
    "check_activations",
    "check_dequantize_args",
    "check_fake_quantize_args",
    "check_gather_args",
    "check_nbits_args",
    "check_out",
    "check_qparams",
    "check_quantize_args",
]
