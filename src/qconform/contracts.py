"""Numeric contracts: what an implementation declares it relaxes from the upstream reference.

The strict default (``STRICT``) is the upstream reference: fp32 accumulation in any order,
weights and intermediates exact, flush-to-zero as the implementation is known to be built, the
reference's NaN rules, exact division, and at MatMulNBits accuracy_level 4 either of the two paths
the op schema allows. A run declares relaxations per implementation (``--contract KEY=VALUE,...``,
a ``:contract=...`` option on the ``--impl`` string, or ``__qconform_contract__`` on a ``py:``
callable); every report states the contract it checked against. docs/contracts.md has the rules.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, fields, replace
from typing import Any

from qconform.errors import ArgumentError

ACCUMULATE = ("fp32", "fp16", "bf16")
STORAGE = ("exact", "fp16", "bf16")
FTZ = ("as-built", "on", "off", "either")
NAN = ("reference", "ieee", "unsupported")
LEVEL4 = ("either", "int8", "float")
BOUND = ("probabilistic", "worst-case")
VARIANT = ("cpu", "cuda", "rocm")  # whose arithmetic a bitsandbytes op follows (qconform.ops.bnb)
ORDER = ("reference", "any")  # the reduction order of an op whose reference fixes one (ggml's vec_dot)
FMA = ("off", "on", "either")  # products contracted into adds where the reference C may be (GCC -mfma)

# unit roundoff of each floating type (round to nearest): 2^-(mantissa bits + 1)
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}


@dataclass(frozen=True)
class Contract:
    """One implementation's declared numerics (each field's first value is the strict default).

    accumulate: the type partial sums are held in (fp16 / bf16: chains of at most ``chain``
        products -- a number, ``K/D`` for a reduction split D ways, default the quantization
        block -- then combined in fp32).
    storage: the type dequantized weights and converted activations are held in before the
        products (exact: the reference's fp32 values).
    ftz: fp32 subnormals flushed (as-built: what qconform knows of the build -- CuPy/hip: on,
        CPU off, a so: library or device py: drop-in unknown, so either).
    nan: the reference's NaN rules (ggml's MAX macro), IEEE max/min (a NaN never wins; a NaN
        input's own output unchecked), or NaN inputs not supported (such cases declined).
    division: exact, or within ``division`` ulp (approximate division and reciprocal).
    level4: MatMulNBits accuracy_level 4 (and QMoE's block-wise weights where ORT's CPU quantizes
        the activations): either path, ORT CPU's int8 activations, or fp32 ones.
    bound: how fp32 accumulation is bounded: probabilistically (lambda*sqrt(n)*u, Higham & Mary
        2019) or in the worst case (gamma_n = n*u/(1-n*u), Higham 2002 section 3.1).
    variant: whose arithmetic the bitsandbytes ops are checked against: bitsandbytes' CPU backend
        (bit-exact against bitsandbytes 0.50.2), its CUDA kernels (fast-math: the float32 literal
        thresholds, NaN skipped, flush-to-zero; gemm_4bit's SIMT kernel) or ROCm (from the source only).
    order: an op whose reference fixes its reduction order (ggml's generic vec_dot: matmul_bt_quant)
        is compared bit for bit in that order (reference), or each output within its bound from the
        data, fp32 sums in any order (any); the bound ops are checked in any order already.
    fma: a product feeding an add rounded first (off: the reference C built without FMA), contracted
        into one fmaf where GCC's -mfma contracts the reference C (on: matmul_bt_quant's vec_dot,
        silu_mul_q8_k's ggml_v_expf AVX2/NEON and AVX512 branches), or either.
    """

    accumulate: str = "fp32"
    chain: str = ""  # "": the op's natural chain (the quantization block); "64"; "K/64"
    storage: str = "exact"
    ftz: str = "as-built"
    nan: str = "reference"
    division: int = 0  # ulp; 0 = exact
    level4: str = "either"
    bound: str = "probabilistic"
    variant: str = "cpu"
    order: str = "reference"
    fma: str = "off"

    def __str__(self) -> str:
        changed = self.relaxed()
        return ",".join(f"{k}={v}" for k, v in changed.items()) if changed else "strict"

    def relaxed(self) -> dict[str, Any]:
        """The fields that differ from the strict default (ftz as-built and level4 either are
        defaults, not relaxations)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    def ftz_modes(self, built: bool | None) -> tuple[bool, ...]:
        """The oracle's ftz values an output may follow: the build's own, or both when unknown."""
        mode = self.ftz
        if mode == "as-built":
            mode = "either" if built is None else ("on" if built else "off")
        return {"on": (True,), "off": (False,), "either": (False, True)}[mode]

    def chain_length(self, n: int, natural: int) -> int:
        """Products per fp16/bf16 partial sum for a reduction of n terms."""
        if not self.chain:
            return min(n, natural)
        if self.chain.startswith("K/"):
            return min(n, -(-n // int(self.chain[2:])))
        return min(n, int(self.chain))

    def merged(self, other: "Contract") -> "Contract":
        """``other``'s relaxations on top of this one's."""
        return replace(self, **other.relaxed())


STRICT = Contract()

LAMBDA = 8.0  # Higham & Mary's lambda of the probabilistic fp32 accumulation bound


def gamma(n: int, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u); inf where n u >= 1 (no bound holds)."""
    return n * u / (1 - n * u) if n * u < 1 else math.inf


def accumulation_error(n: int, chain: int, contract: Contract) -> float:
    """Relative error (to sum |terms|) of summing n terms as the contract allows: fp32 in any
    order, lambda*sqrt(n)*u (Higham & Mary, SIAM J. Sci. Comput. 41(5) 2019, Theorem 3.1) or the
    worst case gamma_n (Higham 2002, eq. 3.5); fp16/bf16 chains of the declared length (``chain``:
    the op's natural one), combined in fp32. Ops outside ``properties`` (the attention and MoE
    bounds of ``qconform.ops``) call it too."""
    u32 = UNIT_ROUNDOFF["fp32"]
    if contract.accumulate == "fp32":
        worst = gamma(n, u32)
        return worst if contract.bound == "worst-case" else min(worst, LAMBDA * math.sqrt(n) * u32)
    length = contract.chain_length(n, chain)
    inner = gamma(length, UNIT_ROUNDOFF[contract.accumulate])
    return inner + gamma(-(-n // length) + 1, u32) * (1 + inner)


def contract_flag(contract: object) -> str:
    """`` --contract ...`` for a replay command line, or '' for the strict default."""
    text = str(contract)
    return "" if text == "strict" else f" --contract {shlex.quote(text)}"

_CHOICES: dict[str, tuple[str, ...]] = {
    "accumulate": ACCUMULATE,
    "storage": STORAGE,
    "ftz": FTZ,
    "nan": NAN,
    "level4": LEVEL4,
    "bound": BOUND,
    "variant": VARIANT,
    "order": ORDER,
    "fma": FMA,
}


def parse_contract(text: str | dict[str, Any] | Contract | None, where: str = "contract") -> Contract:
    """``"storage=fp16,accumulate=fp16,chain=64,division=2ulp"`` (or a dict, or a Contract) ->
    Contract; ``strict`` or empty is the default. Errors name the key and its allowed values."""
    if text is None or isinstance(text, Contract):
        return text or STRICT
    items = text.items() if isinstance(text, dict) else _pairs(text, where)
    values: dict[str, Any] = {}
    for key, value in items:
        key, value = str(key).strip(), str(value).strip()
        if key in _CHOICES:
            if value not in _CHOICES[key]:
                raise ArgumentError(f"{where}: {key} must be one of {', '.join(_CHOICES[key])}, got {value!r}")
            values[key] = value
        elif key == "chain":
            count = value[2:] if value.startswith("K/") else value
            if not count.isdigit() or int(count) < 1:
                raise ArgumentError(f"{where}: chain must be a number of products or K/D (D > 0), got {value!r}")
            values[key] = value
        elif key == "division":
            ulp = value[:-3] if value.endswith("ulp") else value
            if value == "exact":
                ulp = "0"
            if not ulp.isdigit():
                raise ArgumentError(f"{where}: division must be exact or Nulp (e.g. 2ulp), got {value!r}")
            values[key] = int(ulp)
        else:
            keys = ", ".join((*_CHOICES, "chain", "division"))
            raise ArgumentError(f"{where}: unknown key {key!r} (keys: {keys})")
    contract = Contract(**values)
    if contract.chain and contract.accumulate == "fp32":
        raise ArgumentError(f"{where}: chain applies to accumulate=fp16 or bf16, not fp32")
    return contract


def _pairs(text: str, where: str) -> list[tuple[str, str]]:
    text = text.strip()
    if text in ("", "strict"):
        return []
    pairs = []
    for item in text.split(","):
        key, eq, value = item.partition("=")
        if not eq:
            raise ArgumentError(f"{where}: expected KEY=VALUE items separated by commas, got {item!r}")
        pairs.append((key, value))
    return pairs
