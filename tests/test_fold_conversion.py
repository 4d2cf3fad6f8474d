"""The storage=fp16 prefill kernel's weight conversion (ort/nbits_wgmma.hip, qk_nbits_wgmma_rs: the fold
kernel), modelled bit for bit from the kernel's own constants: the code byte broadcast by
``prmt(w, w, qk_wg_pair_selector(byte))``, each half's code masked where it lies and or-ed with the fp16
1024 (``qk_wg_code_pair``), then ``fma.rn.f16x2(x, nmul, add0 + z zmul)``. Every byte, zero point and lane
kind must give the fp16 pair (q_lo - z, q_hi - z) exactly (the codes of the wgmma fragment's k = 2 t and
2 t + 1: u4 the byte's low and high nibble; u2 bits 4 (t % 2) + 0-1 and + 2-3). The fma is modelled in
float64 (the fp16 product is exact there, the sum too) with one rounding to fp16, as fma.rn does."""

from __future__ import annotations

import re

import numpy as np
import pytest

from qconform.device.registry import KERNEL_DIR

SOURCE = KERNEL_DIR / "ort/nbits_wgmma.hip"
KINDS = ("u4", "u2 odd", "u2 even")  # the order of the kernel's `BITS == 4 ? u4 : odd ? u2 odd : u2 even`


def kernel_constants(source: str) -> dict[str, dict[str, int]]:
    """{name: {kind: value}} of the conversion's per-lane constants as the kernel spells them."""
    out = {}
    for name in ("nmask", "nmul", "add0", "zmul"):
        pattern = rf"const qk_u32 {name} = qk_wg_pin\(BITS == 4 \? (0x\w+)u : odd \? (0x\w+)u : (0x\w+)u, lane\);"
        found = re.findall(pattern, source)
        assert len(found) == 1, name
        out[name] = {kind: int(v, 16) for kind, v in zip(KINDS, found[0], strict=True)}
    return out


def halves(x: np.ndarray) -> np.ndarray:
    """The two fp16 halves (lo, hi) of 32-bit words, as float64."""
    return np.stack([(x & 0xFFFF), (x >> 16)], -1).astype(np.uint16).view(np.float16).astype(np.float64)


def conversion_errors(c: dict[str, dict[str, int]], kind: str) -> list[tuple[int, int]]:
    """(byte, z) where the modelled conversion is not (q_lo - z, q_hi - z) exactly, over every byte and
    every zero point of the width (the default 2^(bits - 1) among them)."""
    bits, odd = (4, False) if kind == "u4" else (2, kind == "u2 odd")
    v = np.arange(256, dtype=np.uint64)
    x = ((v * 0x01010101) & c["nmask"][kind]) | 0x64006400  # prmt(w, w, byte | byte << 4 | ...) broadcasts
    lo_shift = 4 * odd
    want = np.stack([(v >> lo_shift) & (2**bits - 1), (v >> (lo_shift + bits)) & (2**bits - 1)], -1).astype(float)
    mul = halves(np.array([c["nmul"][kind]], dtype=np.uint64))
    bad = []
    for z in range(2**bits):
        add = halves(np.array([(c["add0"][kind] + z * c["zmul"][kind]) & 0xFFFFFFFF], dtype=np.uint64))
        got = (halves(x) * mul + add).astype(np.float16).astype(np.float64)
        bad += [(int(b), z) for b in np.nonzero((got != want - z).any(-1))[0]]
    return bad


def test_every_byte_and_zero_point_converts_exactly() -> None:
    c = kernel_constants(SOURCE.read_text())
    for kind in KINDS:
        assert conversion_errors(c, kind) == [], kind


@pytest.mark.parametrize(
    "name,kind,value",
    [
        ("nmask", "u2 odd", 0x000C0003),  # the even lanes' codes read by the odd lanes
        ("nmask", "u4", 0x000F00F0),  # the nibbles swapped between the halves
        ("nmul", "u4", 0x3C003C00),  # the high nibble not scaled back by 1 / 16
        ("add0", "u2 even", 0xDC00E800),  # -2048: the magic's 1024 not removed exactly
        ("zmul", "u2 odd", 0x00100010),  # z in the high half in units of 2^-4, not 2^-6
    ],
)
def test_a_wrong_constant_is_caught(name: str, kind: str, value: int) -> None:
    """Mutants of the constants: each gives wrong pairs for some byte or zero point."""
    c = kernel_constants(SOURCE.read_text())
    assert c[name][kind] != value
    c[name][kind] = value
    assert conversion_errors(c, kind)


def test_the_kernel_converts_as_modelled() -> None:
    """The modelled steps are the kernel's lines: the byte broadcast, the masked or with the 1024, the fma by
    nmul with the zero point's addend (default and packed), and the selector's nibbles."""
    source = SOURCE.read_text()
    for line in (
        "return (qk_u32)(byte | byte << 4 | (4 + byte) << 8 | (4 + byte) << 12);",
        "return qk_and_or(qk_prmt(w, w, sel), mask, 0x64006400u);",
        "const qk_u32 zdef = add0 + (qk_u32)(1 << (BITS - 1)) * zmul;",
        "off = add0 + ((zw >> (bit & 31)) & ((1u << BITS) - 1u)) * zmul;",
        "qk_mul_f16x2(qk_fma_f16x2(qk_wg_code_pair(w[j], psel0, nmask), nmul, off), sp);",
        "f[4 * j + h] = qk_mul_f16x2(qk_fma_f16x2(x0, nmul, off), sp);",
        "f[4 * j + 2 + h] = qk_mul_f16x2(qk_fma_f16x2(x1, nmul, off), sp);",
        'asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));',
    ):
        assert source.count(line) == 1, line
