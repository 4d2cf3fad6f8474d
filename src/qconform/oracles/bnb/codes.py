"""bitsandbytes code tables as float32 bit patterns, and the thresholds each backend compares against
(docs/bnb-4bit.md 1.1, 1.2, 2.1, 2.2, 4.4).

Sources (bitsandbytes-foundation/bitsandbytes):
- NF4: bitsandbytes/functional.py ``get_4bit_type("nf4")`` (the same literals are in csrc/kernels.cu
  ``nf4_dequantization_lut`` and csrc/cpu_ops.cpp ``nf4_lut``): an ascending lookup table, the nibble
  is the index. Python turns each double literal into float32 (``torch.tensor``) and divides by the
  maximum, 1.0.
- FP4: functional.py ``get_4bit_type("fp4")``: ``[0, 0.0625, 8, 12, 4, 6, 2, 3, -0, -0.0625, -8, -12, -4,
  -6, -2, -3]`` divided by 12 in float32. Bit 3 is the sign. The Python list holds the int ``-0``, so
  code 8 is **+0.0** there; csrc/kernels.cu ``dDequantizeFP4Tree`` (``lut[q & 7] * (1 - 2*sign)``) and
  csrc/cpu_ops.cpp ``fp4_lut`` give **-0.0**; the AVX-512 ``set_fp4_lut`` in cpu_ops.cpp has +0.0.
- CPU/default quantize (bitsandbytes/backends/default/ops.py ``_get_4bit_quantize_bounds``): the 15
  float32 midpoints ``(code[order[k]] + code[order[k+1]]) / 2`` of the sorted code with
  ``order = argsort(code)``, then ``torch.bucketize`` (right=False: the count of bounds < s, so a tie
  goes to the lower value, NaN to 15), then ``order[q]`` for FP4.
- CUDA quantize (csrc/kernels.cu ``dQuantizeNF4``, ``dQuantizeFP4``): strict ``>`` decision trees whose
  thresholds are the float32 values of the source's decimal literals, rounded by nvcc directly from
  decimal to float32. ``np.float32("0.8614784181118011")`` rounds through double and is one ulp off
  for four of them, so the bit patterns are hard-coded (a test re-derives them from the literals).
- 8-bit dynamic map: functional.py ``create_dynamic_map(signed=True, max_exponent_bits=7,
  total_bits=8)``, cached by bitsandbytes as ``name2qmap["dynamic"]`` and used for nested absmax.
  It goes through ``torch.linspace`` in float32, so it is hard-coded: indices 0..127 below, index
  ``k`` in 128..254 is ``-code[254 - k]`` and index 255 is 1.0.
"""

from __future__ import annotations

import numpy as np


def _f32(words: list[int]) -> np.ndarray:
    return np.array(words, dtype=np.uint32).view(np.float32)


NF4 = _f32([
    0xBF800000, 0xBF3239B1, 0xBF066B30, 0xBECA32A0, 0xBE91A24D, 0xBE3D353F, 0xBDBA7871, 0x00000000,
    0x3DA2FAFF, 0x3E24CAE3, 0x3E7C04DD, 0x3EAD033A, 0x3EE1A4B8, 0x3F1007AB, 0x3F3913B3, 0x3F800000,
])  # fmt: skip
NF4_LITERALS = (
    "-1.0", "-0.6961928009986877", "-0.5250730514526367", "-0.39491748809814453", "-0.28444138169288635",
    "-0.18477343022823334", "-0.09105003625154495", "0.0", "0.07958029955625534", "0.16093020141124725",
    "0.24611230194568634", "0.33791524171829224", "0.44070982933044434", "0.5626170039176941",
    "0.7229568362236023", "1.0",
)  # fmt: skip

_FP4_POS = [0x00000000, 0x3BAAAAAB, 0x3F2AAAAB, 0x3F800000, 0x3EAAAAAB, 0x3F000000, 0x3E2AAAAB, 0x3E800000]
FP4 = _f32(_FP4_POS + [0x00000000] + [w | 0x80000000 for w in _FP4_POS[1:]])  # Python table: code 8 is +0
FP4_NATIVE = _f32(_FP4_POS + [w | 0x80000000 for w in _FP4_POS])  # C++/CUDA table: code 8 is -0
FP4_RAW = (0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, -0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0)

CODES = {"nf4": NF4, "fp4": FP4}


def get_4bit_type(quant_type: str) -> np.ndarray:
    """The float32 table ``functional.get_4bit_type(quant_type)`` returns (FP4 code 8 is +0)."""
    return CODES[quant_type].copy()


def native_4bit_table(quant_type: str) -> np.ndarray:
    """The table of the C++ scalar and CUDA dequantize kernels (FP4 code 8 is -0)."""
    return (NF4 if quant_type == "nf4" else FP4_NATIVE).copy()


def _sorted_bounds(code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(code, kind="stable").astype(np.uint8)  # FP4: the two zeros stay as (0, 8)
    s = code[order]
    with np.errstate(over="ignore"):
        mid = ((s[:-1] + s[1:]).astype(np.float32) / np.float32(2)).astype(np.float32)
    return mid, order


CPU_BOUNDS: dict[str, np.ndarray] = {}
CPU_ORDER: dict[str, np.ndarray] = {}
for _qt, _code in CODES.items():
    CPU_BOUNDS[_qt], CPU_ORDER[_qt] = _sorted_bounds(_code)

NF4_CUDA_THRESHOLDS = _f32([
    0xBF591CD9, 0xBF1C5270, 0xBEEB8480, 0xBEADEA76, 0xBE703CEC, 0xBE0D38BC, 0xBD3A7871, 0x3D22FAFF,
    0x3DF64863, 0x3E5067E0, 0x3E9582D4, 0x3EC753F9, 0x3F006D03, 0x3F248DAF, 0x3F5C89D9,
])  # fmt: skip
NF4_CUDA_LITERALS = (
    "-0.8480964004993439", "-0.6106329262256622", "-0.4599952697753906", "-0.33967943489551544",
    "-0.23460740596055984", "-0.13791173323988914", "-0.045525018125772476", "0.03979014977812767",
    "0.1202552504837513", "0.2035212516784668", "0.2920137718319893", "0.3893125355243683",
    "0.5016634166240692", "0.6427869200706482", "0.8614784181118011",
)  # fmt: skip
# dQuantizeFP4 on |s|: code = 3 if a > T6; 2 if a > T5; 5 if a > T4; 4 if a > T3; 7 if a > T2; 6 if a > T1;
# 1 if a > T0; else 0. FP4_CUDA_MAGNITUDE_CODES[k] is the code for T_{k-1} < a <= T_k (k = 0: a <= T0).
FP4_CUDA_THRESHOLDS = _f32([0x3B2AAAB9, 0x3DB00000, 0x3E555555, 0x3E955555, 0x3ED55556, 0x3F155550, 0x3F555555])
FP4_CUDA_LITERALS = ("0.00260417", "0.0859375", "0.20833333", "0.29166667", "0.4166667", "0.583333", "0.8333333")
FP4_CUDA_MAGNITUDE_CODES = np.array([0, 1, 6, 7, 4, 5, 2, 3], dtype=np.uint8)

_DYNAMIC_LOWER = [
    0xBF7E3333, 0xBF7A999A, 0xBF770000, 0xBF736666, 0xBF6FCCCD, 0xBF6C3333, 0xBF68999A, 0xBF650000,
    0xBF616666, 0xBF5DCCCD, 0xBF5A3333, 0xBF56999A, 0xBF530000, 0xBF4F6666, 0xBF4BCCCD, 0xBF483333,
    0xBF44999A, 0xBF410000, 0xBF3D6666, 0xBF39CCCD, 0xBF363334, 0xBF32999A, 0xBF2F0000, 0xBF2B6666,
    0xBF27CCCD, 0xBF243334, 0xBF20999A, 0xBF1D0000, 0xBF196666, 0xBF15CCCD, 0xBF123334, 0xBF0E999A,
    0xBF0B0000, 0xBF076666, 0xBF03CCCC, 0xBF003333, 0xBEF93332, 0xBEF20000, 0xBEEACCCC, 0xBEE3999A,
    0xBEDC6666, 0xBED53333, 0xBECE0000, 0xBEC6CCCC, 0xBEBF999A, 0xBEB86666, 0xBEB13333, 0xBEAA0000,
    0xBEA2CCCC, 0xBE9B999A, 0xBE946666, 0xBE8D3334, 0xBE860000, 0xBE7D9999, 0xBE6F3333, 0xBE60CCCD,
    0xBE526666, 0xBE440000, 0xBE35999A, 0xBE273333, 0xBE18CCCD, 0xBE0A6666, 0xBDF80000, 0xBDDB3334,
    0xBDC9EB85, 0xBDC428F7, 0xBDBE6667, 0xBDB8A3D7, 0xBDB2E148, 0xBDAD1EB8, 0xBDA75C2A, 0xBDA1999A,
    0xBD9BD70A, 0xBD96147B, 0xBD9051EB, 0xBD8A8F5D, 0xBD84CCCD, 0xBD7E147B, 0xBD728F5D, 0xBD670A3D,
    0xBD5B851F, 0xBD500000, 0xBD447AE1, 0xBD38F5C3, 0xBD2D70A3, 0xBD21EB85, 0xBD166667, 0xBD0AE148,
    0xBCFEB852, 0xBCE7AE15, 0xBCD0A3D7, 0xBCB9999A, 0xBCA28F5D, 0xBC8B851F, 0xBC68F5C3, 0xBC3AE148,
    0xBC1F3B64, 0xBC160418, 0xBC0CCCCD, 0xBC039581, 0xBBF4BC6A, 0xBBE24DD3, 0xBBCFDF3B, 0xBBBD70A4,
    0xBBAB020D, 0xBB989374, 0xBB8624DD, 0xBB676C8A, 0xBB428F5C, 0xBB1DB22D, 0xBAF1A9FC, 0xBAA7EF9D,
    0xBA7765FF, 0xBA59E83E, 0xBA3C6A80, 0xBA1EECC1, 0xBA016F01, 0xB9C7E283, 0xB98CE705, 0xB923D70B,
    0xB8BA1F4B, 0xB88AEFB3, 0xB8378034, 0xB7B24206, 0xB70205FF, 0xB65A1A94, 0xB513A3B7, 0x00000000,
]  # fmt: skip
DYNAMIC_MAP = _f32(_DYNAMIC_LOWER + [w ^ 0x80000000 for w in reversed(_DYNAMIC_LOWER[:-1])] + [0x3F800000])
DYNAMIC_MAP_SHA256 = "e732639a65f497b4ad684bb166a4467708255edd5207757de8b8f0c7e1fda89c"  # of the 1024 LE bytes


def create_dynamic_map() -> np.ndarray:
    """bitsandbytes' default 8-bit code, ``create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)``."""
    return DYNAMIC_MAP.copy()
