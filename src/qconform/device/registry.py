"""Every device kernel qconform ships, of every family, with its source and (for kernels with
the op's declared ABI, ``qconform.ops.abi``) its launch geometry; the ``hip:`` / ``so:`` spec
parser. Imports no CuPy.

The ggml kernels take their op's declared ABI (``(x, y, n_blocks)``, the same a user's ``hip:``
kernel gets) and are launched with ``blockDim.x = threads`` and ``gridDim.x = ceil(n_blocks *
lanes / threads)``; the ONNX Runtime family's kernels take their own arguments from their
launchers (``qconform.device.ort``), listed here with ``geometry=None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qconform.errors import ArgumentError

KERNEL_DIR = Path(__file__).parent / "kernels"
COMMON_DIR = KERNEL_DIR / "common"  # headers every kernel may include (on the include path)
MAX_GRID_X = 2**31 - 1
# per-SM limits of the NVIDIA parts the matrix-unit kernel is tuned on (sm_80 .. sm_90)
MAX_CTAS_PER_SM = 32
MAX_WARPS_PER_SM = 64
REGS_PER_SM = 65536
REG_ALLOC_UNIT = 8  # registers per thread are allocated in multiples of this


@dataclass(frozen=True)
class Geometry:
    lanes: int = 1  # threads per format block
    threads: int = 256  # threads per CTA (blockDim.x)

    def grid(self, n_blocks: int) -> int:
        return -(-n_blocks * self.lanes // self.threads)


@dataclass(frozen=True)
class KernelSpec:
    op: str
    variant: str
    symbol: str
    source: str  # file under kernels/: <family>/<file>
    geometry: Geometry | None  # None: launched by its family's launcher with its own arguments
    doc: str
    leaves: tuple[str, ...] | None = None  # the op's leaves it covers (None: every leaf; the others are declined)

    @property
    def path(self) -> Path:
        return KERNEL_DIR / self.source

    @property
    def family(self) -> str:
        return self.source.split("/")[0]


GGML_KERNELS: tuple[KernelSpec, ...] = (
    KernelSpec(
        "q8_k_quant",
        "coop",
        "qk_q8_k_quant_coop",
        "ggml/q8_quant.hip",
        Geometry(8, 256),
        "8 lanes per super-block, shuffle amax (ties to the lower index)",
    ),
    KernelSpec(
        "q8_k_quant",
        "w32",
        "qk_q8_k_quant_w32",
        "ggml/q8_quant.hip",
        Geometry(32, 64),
        "32 lanes per super-block (8 values a lane), shuffle amax (ties to the lower index): short rows",
    ),
    KernelSpec(
        "q8_k_quant",
        "ref",
        "qk_q8_k_quant_ref",
        "ggml/q8_quant.hip",
        Geometry(1, 32),
        "one thread per super-block in the reference order, chunks staged through shared memory",
    ),
    KernelSpec(
        "q8_0_quant",
        "coop",
        "qk_q8_0_quant",
        "ggml/q8_quant.hip",
        Geometry(2, 256),
        "2 lanes per block, ordered MAX scan",
    ),
    KernelSpec(
        "q8_k_dequant", "coop", "qk_q8_k_dequant", "ggml/q8_quant.hip", Geometry(64, 256), "a float4 per thread"
    ),
    KernelSpec("q8_0_dequant", "coop", "qk_q8_0_dequant", "ggml/q8_quant.hip", Geometry(8, 256), "a float4 per thread"),
    KernelSpec(
        "q4_0_dequant",
        "coop",
        "qk_q4_0_dequant",
        "ggml/dequant.hip",
        Geometry(4, 256),
        "4 lanes per block: 4 bytes of qs each, their low and high nibbles as two float4",
    ),
    KernelSpec(
        "q4_k_dequant",
        "coop",
        "qk_q4_k_dequant",
        "ggml/dequant.hip",
        Geometry(32, 256),
        "32 lanes per super-block: two float4 each (sub-blocks j and j + 4)",
    ),
    KernelSpec(
        "q5_k_dequant",
        "coop",
        "qk_q5_k_dequant",
        "ggml/dequant.hip",
        Geometry(32, 256),
        "32 lanes per super-block: two float4 each (sub-blocks j and j + 4)",
    ),
    KernelSpec(
        "q6_k_dequant",
        "coop",
        "qk_q6_k_dequant",
        "ggml/dequant.hip",
        Geometry(32, 256),
        "32 lanes per super-block: two float4 each (the two 128-value halves)",
    ),
)

VARIANTS = tuple(dict.fromkeys(k.variant for k in GGML_KERNELS))


def kernel_for(op: str, variant: str | None = None) -> KernelSpec:
    """The kernel of ``op`` in ``variant`` (None: the first listed); an op with one kernel uses it
    for every variant."""
    mine = [k for k in GGML_KERNELS if k.op == op]
    if not mine:
        known = sorted({k.op for k in GGML_KERNELS})
        raise ArgumentError(f"op: no device kernel for {op!r} with its ABI; they exist for {known}")
    if variant is None or len(mine) == 1:
        return mine[0]
    for k in mine:
        if k.variant == variant:
            return k
    raise ArgumentError(f"variant: {op} has no {variant!r} kernel; variants: {[k.variant for k in mine]}")


def check_grid(op: str, n_blocks: int, geometry: Geometry) -> int:
    grid = geometry.grid(n_blocks)
    if grid > MAX_GRID_X:
        raise ArgumentError(
            f"{op}: {n_blocks} blocks need a grid of {grid} CTAs, over the {MAX_GRID_X} a launch allows; split the rows"
        )
    return grid


@dataclass(frozen=True)
class Launch:
    """A ``hip:`` launch geometry: ``threads`` per CTA, ``lanes`` per work item (None: the op's),
    a fixed ``grid`` (None: from the work), dynamic shared memory, and a ``requires`` predicate
    over the ABI's scalar arguments (cases where it is false are declined)."""

    lanes: int | None = None
    threads: int | None = None
    grid: int | None = None
    smem: int = 0
    options: tuple[str, ...] = ()
    requires: str | None = None

    def shape(self, abi: Any, work: int) -> tuple[int, int]:
        threads = self.threads or abi.threads
        grid = self.grid or -(-work * (self.lanes or abi.lanes) // threads)
        if grid > MAX_GRID_X:
            raise ArgumentError(f"grid: {work} work items need {grid} CTAs, over the {MAX_GRID_X} a launch allows")
        return grid, threads


SPEC_OPTIONS = ("lanes", "threads", "grid", "smem", "opt", "requires")


def parse_impl_spec(spec: str) -> tuple[Path, str, Launch]:
    """``hip:path/file.hip:symbol[:key=value]...`` or ``so:path/lib.so:symbol[:requires=EXPR]`` ->
    (path, symbol, launch). Keys: ``lanes``, ``threads``, ``grid``, ``smem`` (positive integers;
    smem may be 0), ``opt`` (one compiler option, repeatable), ``requires`` (a Python expression
    over the op's ABI scalars, e.g. ``bits == 2 and block_size % 32 == 0``: cases where it is false
    are declined)."""
    kind, _, body = spec.partition(":")
    parts = body.split(":")
    usage = f"'{kind}:path/file:symbol[:key=value]...'"
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise ArgumentError(f"impl: {kind}: implementations are {usage}, got {spec!r}")
    opts: dict[str, Any] = {}
    options: list[str] = []
    for item in parts[2:]:
        key, sep, value = item.partition("=")
        allowed = SPEC_OPTIONS if kind == "hip" else ("requires",)
        if not sep or key not in allowed:
            raise ArgumentError(f"impl: {spec!r}: options are {', '.join(k + '=...' for k in allowed)}, got {item!r}")
        if key == "opt":
            options.append(value)
        elif key == "requires":
            opts[key] = value
        elif not value.isdigit() or (int(value) < 1 and key != "smem"):
            raise ArgumentError(f"impl: {spec!r}: {key} must be a positive integer, got {value!r}")
        else:
            opts[key] = int(value)
    path = Path(parts[0])
    if not path.is_file():
        what = "kernel source" if kind == "hip" else "shared library"
        raise ArgumentError(f"impl: no such {what} {parts[0]!r}")
    return path, parts[1], Launch(**opts, options=tuple(options))


def resident_ctas(warps: int, regs: int, smem: int = 0, smem_sm: int = 0) -> int:
    """CTAs of ``warps`` warps resident on one SM at once: by CTAs, warps and ``regs`` registers a
    thread (allocated in units of REG_ALLOC_UNIT), and with ``smem_sm`` given by shared memory
    (``smem`` bytes a CTA, 1 KiB reserved each)."""
    per_thread = -(-regs // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    ctas = min(MAX_CTAS_PER_SM, MAX_WARPS_PER_SM // warps, REGS_PER_SM // (per_thread * 32 * warps))
    return min(ctas, smem_sm // (smem + 1024)) if smem_sm else ctas


@dataclass(frozen=True)
class MmaShape:
    """The matrix-unit MatMulNBits kernel's work split: a warp owns ``r`` tiles of 16 rows x ``t``
    groups of 8 tokens and keeps ``p`` K chunks of weights in flight, compiled for ``o`` CTAs of
    256 threads per SM (its register cap); ``wk`` warps split one such item's K chunks (partial
    sums added in shared memory, in warp order; 0: as many as bring the launch to
    ``warps_per_sm`` warps per SM, at most 8); ``wi`` items per CTA."""

    r: int
    t: int
    p: int
    o: int = 1
    wk: int = 0
    wi: int = 1
    warps_per_sm: int = 16
    # qk_nbits_mmaa: 16-byte weight loads streamed through a shared-memory ring of p stages per
    # warp, one group of 8 tokens, the default zero point (t = wi = 1; o >= 2: compiled for o CTAs
    # of 256 threads an SM, symbol ending _o{o}; 1: the compiler's registers)
    ring: bool = False

    def _ring_suffix(self) -> str:
        return f"_o{self.o}" if self.o >= 2 else ""

    def symbol(self, bits: int) -> str:
        if self.ring:
            return f"qk_nbits_mmaa_u{bits}_r{self.r}_s{self.p}{self._ring_suffix()}"
        return f"qk_nbits_mma_u{bits}_r{self.r}_t{self.t}_p{self.p}_o{self.o}"

    def symbol_f32(self, bits: int) -> str:
        """The ring kernel's fp32-activation twin (activations split into fp16 hi + lo first)."""
        return f"qk_nbits_mmaf_u{bits}_r{self.r}_s{self.p}{self._ring_suffix()}"

    def ring_bytes(self) -> int:
        """Shared memory of one warp's ring: per stage, 16 R rows x (16 weight + 4 scale) bytes x 4 lanes."""
        return self.p * self.r * 2 * 32 * 20

    def ring_split(self, items: int, units: int, act_bytes: int, smem_cta: int, sms: int) -> int:
        """The warps per CTA (1, 2, 4, 8) splitting the ring kernel's ``units`` superchunks: 4, or 8
        where 4 would give the launch fewer than ``warps_per_sm`` warps an SM in all; fewer where K
        has under 2 superchunks a warp or the CTA's shared memory (``act_bytes`` of staged
        activations and the rings) would pass ``smem_cta``; 0 if one warp does not fit. Measured
        on the H200 with each split forced (docs/perf-notes.md, session 14), bench shapes x u2 / u4 x
        M 1 / 8: where 4 is taken (5120 x 17920, 4096 x 14336, the lm_head) it was the fastest or
        within 3% of it in 11 of 12 cells (lm_head u4 M 1: 89.2 us, against 131.1 with the 1 the
        previous rule chose; 4096 x 14336 u2 M 1: 14.5 against 18.0 with 8; the exception 5120 x
        17920 u4 M 8: 31.4 against 27.8 with 2), and where 8 is taken (17920 x 5120, 14336 x 4096:
        320 and 256 CTAs) it was the fastest in all 8."""
        best = 0
        for wk in (1, 2, 4, 8):
            if act_bytes + wk * self.ring_bytes() > smem_cta or (best and units < 2 * wk):
                break
            best = wk
            if wk >= 4 and items * wk >= self.warps_per_sm * sms:
                break
        return best

    def k_split(self, items: int, n_chunks: int, regs: int, sms: int) -> int:
        """The most warps per item (1, 2, 4, 8) that keeps the launch within ``warps_per_sm``
        warps per SM and every CTA resident at once (one wave, from the kernel's registers),
        with at least 2p chunks per warp."""
        if self.wk:
            return self.wk
        best = 1
        for wk in (2, 4, 8):
            one_wave = -(-items // self.wi) <= resident_ctas(wk * self.wi, regs) * sms
            if one_wave and items * wk <= self.warps_per_sm * sms and n_chunks >= 2 * wk * self.p:
                best = wk
        return best


MMA_SHAPES = {
    "decode": MmaShape(r=2, t=1, p=3, o=2, ring=True, warps_per_sm=12),
    "decode_wave": MmaShape(r=2, t=1, p=3, ring=True, warps_per_sm=12),
    "decode_narrow": MmaShape(r=1, t=1, p=4, o=3, ring=True, warps_per_sm=12),
    "decode_zp": MmaShape(r=2, t=1, p=2, o=1),
    "prefill": MmaShape(r=2, t=4, p=2, o=1, wk=1, wi=4),
}
"""decode: M <= 8 (one group of 8 tokens), compiled for 2 CTAs of 256 threads an SM (up to 128
registers); decode_wave: the same with the compiler's registers (80 u2, 70 u4), taken where decode's
CTAs would leave a nearly empty last wave (``tail_wave``) even with ``fewer_warps``; decode_narrow:
the same for weights of too few rows to give every SM two of decode's tiles (``decode_shape``),
compiled for 3 CTAs (80 registers, not 56); prefill: larger M. The shapes the device suite ran
(docs/perf-notes.md has the bench's times for every candidate)."""


def decode_shape(N: int, sms: int) -> MmaShape:
    """The ring decode shape for N weight rows on ``sms`` SMs: 16-row tiles (decode_narrow) when
    32-row ones would give fewer than two per SM. Measured on the H200 (docs/perf-notes.md):
    17920 x 5120 and 14336 x 4096 take 4-14% less time with 16-row tiles, 5120 x 17920 20% more."""
    wide = MMA_SHAPES["decode"]
    return MMA_SHAPES["decode_narrow"] if -(-N // (16 * wide.r)) < 2 * sms else wide


TAIL_WAVE = 1.25


def tail_wave(ctas: int, slots: int) -> bool:
    """``ctas`` CTAs on ``slots`` resident at once leave a last wave at most a quarter full (over
    one wave, at most TAIL_WAVE waves). Measured on the H200 (docs/perf-notes.md, session 14): 5120 x
    17920 at M 8 took 23.5 / 36.3 us (u2 / u4) with decode's 560 CTAs on 528 slots, 21.8 / 31.5 with
    decode_wave's 792."""
    return slots < ctas <= TAIL_WAVE * slots


def fewer_warps(wk: int) -> int:
    """The ring kernel's warps a CTA tried first where ``wk`` would leave a tail wave: three quarters
    of them (4 -> 3, 8 -> 6; the kernel splits the superchunks over any number). Measured on the H200
    (docs/perf-notes.md, session 15): 5120 x 17920's 560 CTAs with 3 warps (5 an SM at 128 registers,
    660 slots) took 20.0 / 21.4 / 25.3 / 25.8 us (u2 M 1, u2 M 8, u4 M 1, u4 M 8) against
    decode_wave's 20.0 / 22.0 / 26.4 / 32.1."""
    return wk - wk // 4


@dataclass(frozen=True)
class GemmShape:
    """The MatMulNBits prefill GEMM's tiles (``qk_nbits_gemm``, ort/nbits_mma.hip): ``wn`` x ``wm``
    warps a CTA, each ``r`` tiles of 16 weight rows x 32 tokens; ``s`` K chunks of 64 in the CTA's
    shared-memory ring."""

    r: int
    wn: int
    wm: int
    s: int

    def symbol(self, bits: int, packed: bool = False) -> str:
        """The kernel; ``packed``: its twin reading packed zero points (symbol ending _z)."""
        return f"qk_nbits_gemm_u{bits}_r{self.r}_n{self.wn}_m{self.wm}_s{self.s}" + ("_z" if packed else "")

    @property
    def rows(self) -> int:
        return 16 * self.r * self.wn

    @property
    def tokens(self) -> int:
        return 32 * self.wm

    @property
    def threads(self) -> int:
        return 32 * self.wn * self.wm

    def smem(self, bits: int, packed: bool = False) -> int:
        """Dynamic shared memory of a CTA: ``s`` stages (per row 8 bits weight bytes, a 4-byte scale
        word and with ``packed`` zero points a 4-byte zero-point word, per token 144 bytes of
        activations) or the fp16 output tile (rows of ``rows`` + 8 halves a token), the larger."""
        stage = self.rows * (8 * bits + (8 if packed else 4)) + self.tokens * 144
        return max(self.s * stage, self.tokens * (self.rows + 8) * 2)


GEMM_SHAPES = {"short": GemmShape(r=4, wn=4, wm=2, s=4), "long": GemmShape(r=4, wn=2, wm=4, s=4)}
"""The prefill GEMM's tiles: short (M <= GEMM_SHORT_M): 256 weight rows x 64 tokens a CTA; long:
128 x 128; both 8 warps and 4 stages. Measured on the H200 with the candidates (docs/perf-notes.md,
session 16), 5120 x 17920, u2 / u4: long the fastest at M 512 .. 4096 (by 4-14%), short at M 16 ..
64 (98-103 us against 185 for long)."""
GEMM_SHORT_M = 64
GEMM_CANDIDATES = (GemmShape(4, 4, 2, 3), GemmShape(2, 4, 4, 4), GemmShape(2, 4, 2, 4))
"""The other tiles the prefill bench times (compiled unless -DQK_MMA_DEFAULT_ONLY)."""


def gemm_shape(M: int) -> GemmShape:
    """The prefill GEMM's tiles for M activation rows."""
    return GEMM_SHAPES["short" if M <= GEMM_SHORT_M else "long"]


GEMM_MIN_M = 16
"""Activation rows from which MatMulNBits (fp16 A, default or packed zero points) takes the GEMM: at
M 16 and 32 on 5120 x 17920 the short tiles took 97-103 us, the previous kernel 101-106 (session 16)."""


WGMMA_MIN_M = 128
"""Activation rows from which MatMulNBits (fp16 A, default or packed zero points) takes the wgmma GEMM
(``qk_nbits_wgmma``, ort/nbits_wgmma.hip) where the device has it (sm_90 with a build for sm_90a): at M
128 .. 4096 it took 0.63-0.75x the time of ``qk_nbits_gemm``'s long tiles on the H200
(docs/perf-notes.md, session 23); its CTAs own 128 tokens, as the long tiles' do, so fewer rows stay
on the GEMM."""
WGMMA_STAGES = 4
WGMMA_TILE = 128
"""The wgmma GEMM's CTA: 128 tokens x 128 weight rows, ``WGMMA_STAGES`` K chunks in flight."""
STORAGE_TYPES = ("exact", "fp16", "bf16")
"""The contracts' ``storage`` values (qconform.contracts.STORAGE, which the device layer does not import):
what a launcher with a ``storage`` parameter accepts."""
WGMMA_FOLD_STAGES = 5
WGMMA_FOLD_MIN_M = 256
"""The wgmma GEMM's ``fold`` form (``qk_nbits_wgmma_fold``, taken under the contract storage=fp16: the
weights held as fp16 (q - z) s in registers, summed over all of K): 256 tokens x 128 weight rows a CTA,
``WGMMA_FOLD_STAGES`` chunks of copies in flight (2 chunks of wgmma). From ``WGMMA_FOLD_MIN_M`` rows:
at M 256 .. 4096 it took 0.57-0.78x the time of the strict wgmma GEMM on the H200, at M 128 more
(its CTAs half empty; docs/perf-notes.md, session 24); below, the strict kernel runs (within any
relaxed bound)."""


def wgmma_tokens(fold: bool = False) -> int:
    """Tokens a wgmma GEMM CTA owns."""
    return 2 * WGMMA_TILE if fold else WGMMA_TILE


def wgmma_tiles(M: int, N: int, fold: bool = False) -> int:
    """CTAs of a wgmma GEMM launch (the launcher's grid): token tiles x 128-row tiles."""
    return -(-M // wgmma_tokens(fold)) * -(-N // WGMMA_TILE)


FOLD_MAX_PARTS = 8  # a split tile's parts at most (the fold kernels' tail split)


def fold_tail_split(tiles: int, n_chunks: int, sms: int) -> tuple[int, int]:
    """(full, parts) of the fold kernel's tail split: the tiles of the whole waves (``sms`` CTAs a wave)
    each on one CTA, each tile of the last, part-empty wave split over ``parts`` CTAs (as many as fill
    that wave, at most ``FOLD_MAX_PARTS`` and ``n_chunks``); (tiles, 1) where no tile would be split.
    The launcher takes ``qk_nbits_wgmma_fold_split`` where parts > 1: on the H100 at 5120 x 17920 it
    took 0.83x the unsplit kernel's time at M 512 (3 waves to 2.125), 0.91-0.92x at M 1024; where
    nothing is split the unsplit kernel was 0.4-1.4% faster (docs/perf-notes.md, session 54)."""
    tail = tiles % sms
    parts = min(FOLD_MAX_PARTS, n_chunks, sms // tail) if tail else 1
    return (tiles - tail, parts) if parts > 1 else (tiles, 1)


def fold_launch_split(M: int, N: int, K: int, sms: int) -> tuple[int, int, int]:
    """(tiles, full, parts) of the fold kernel's launch for M x K activations and N weight rows on ``sms``
    SMs: ``wgmma_tiles`` and ``fold_tail_split`` over K's 64-wide chunks."""
    tiles = wgmma_tiles(M, N, fold=True)
    return (tiles, *fold_tail_split(tiles, -(-K // 64), sms))


def wgmma_symbol(bits: int, packed: bool = False, fold: bool = False, split: bool = False) -> str:
    """The wgmma GEMM; ``packed``: its twin reading packed zero points (symbol ending _z); ``fold``:
    the storage=fp16 form (``qk_nbits_wgmma_fold_*``); ``split``: that form with the last wave's tiles
    split by K (``qk_nbits_wgmma_fold_split_*``, ``fold_tail_split``)."""
    stages = WGMMA_FOLD_STAGES if fold or split else WGMMA_STAGES
    form = "_fold_split" if split else "_fold" if fold else ""
    return f"qk_nbits_wgmma{form}_u{bits}_s{stages}" + ("_z" if packed else "")


def wgmma_smem(bits: int, packed: bool = False, fold: bool = False) -> int:
    """The wgmma GEMM's dynamic shared memory (ort/nbits_wgmma.hip, QkWgLayout / QkWgRsLayout, plus 1 KB
    to align its base to 1024 bytes): per stage 128 bytes of activations a token, the raw weights (8
    bits bytes a row) and scale words (4 bytes a row); with ``packed`` zero points a zero-point word a
    thread (8 bytes a row; ``fold``: a word a row, and the stage's 8-byte mbarrier); unless ``fold``, 3
    fp16 weight stages of 16 KB and 4 fp32 scale stages (4 runs of 32 floats, 36 apart)."""
    s, rows = (WGMMA_FOLD_STAGES if fold else WGMMA_STAGES), WGMMA_TILE
    stage = wgmma_tokens(fold) * 128 + rows * 8 * bits + rows * 4 + (rows * (4 if fold else 8) if packed else 0)
    return s * (stage + (8 if fold else 0)) + (0 if fold else 3 * rows * 128 + 4 * 4 * 36 * 4) + 1024


MMA_DECODE_CANDIDATES = (
    *(MmaShape(r, 1, p, o) for r, p, o in ((2, 2, 1), (2, 2, 3), (2, 4, 2), (4, 2, 2), (1, 4, 4))),
    *(MmaShape(r, 1, p, o, ring=True) for r, p, o in ((2, 4, 1), (2, 3, 2), (2, 3, 1), (2, 2, 1))),
    *(MmaShape(r, 1, p, o, ring=True) for r, p, o in ((1, 4, 3), (1, 4, 1), (1, 6, 1), (4, 2, 1))),
)
"""The decode shapes the GEMV bench times (each also at several ``warps_per_sm``)."""


def function_kernel(
    family: str, op: str, symbol: str, source: str, doc: str, leaves: tuple[str, ...] | None = None
) -> KernelSpec:
    """A kernel a family's function launcher runs with its own arguments (``geometry`` None)."""
    return KernelSpec(op, "cupy", symbol, f"{family}/{source}", None, doc, leaves)


def _ort(op: str, symbol: str, source: str, doc: str, leaves: tuple[str, ...] | None = None) -> KernelSpec:
    return function_kernel("ort", op, symbol, source, doc, leaves)


def _mma_symbols() -> tuple[KernelSpec, ...]:
    return (
        tuple(
            _ort("matmul_nbits", shape.symbol(bits), "nbits_mma.hip", f"matrix-unit u{bits} GEMM, {use} shape")
            for use, shape in MMA_SHAPES.items()
            for bits in (2, 4)
        )
        + tuple(
            _ort("matmul_nbits", shape.symbol_f32(bits), "nbits_mma.hip", f"matrix-unit u{bits} decode, fp32 A, {use}")
            for use, shape in MMA_SHAPES.items()
            if shape.ring
            for bits in (2, 4)
        )
        + (_ort("matmul_nbits", "qk_nbits_split_a", "nbits_mma.hip", "fp32 A to fp16 hi + lo rows, per-token 2^e"),)
        + tuple(
            _ort("matmul_nbits", shape.symbol(bits, z), "nbits_mma.hip", f"prefill u{bits} GEMM, {use} tiles{zd}")
            for use, shape in GEMM_SHAPES.items()
            for bits in (2, 4)
            for z, zd in ((False, ""), (True, ", packed zero points"))
        )
        + tuple(
            _ort(
                "matmul_nbits",
                wgmma_symbol(bits, z, f, sp),
                "nbits_wgmma.hip",
                f"prefill u{bits} GEMM, wgmma (sm_90a){fd}{zd}",
            )
            for bits in (2, 4)
            for f, sp, fd in (
                (False, False, ""),
                (True, False, ", storage=fp16 (scales folded into fp16 weights)"),
                (True, True, ", storage=fp16, the last wave's tiles split by K"),
            )
            for z, zd in ((False, ""), (True, ", packed zero points"))
        )
    )


FAKE_QUANTIZE_LEAVES = (  # the integer types: the ABI's binder declines fp8, naming the dtype
    *(f"Xfp32_Q{q}_Yfp32" for q in ("u8", "i8", "u16", "i16", "u4", "i4", "u2", "i2")),
    "Xfp16_Qu8_Yfp16",
)
ORT_KERNELS: tuple[KernelSpec, ...] = (
    _ort("dequantize_nbits", "qk_nbits_dequant", "nbits_gemv.hip", "one thread per weight"),
    _ort("matmul_nbits", "qk_nbits_gemv", "nbits_gemv.hip", "a 32-lane group per output (any bits, fp32 A)"),
    _ort("matmul_nbits", "qk_quantize_a_int8", "nbits_gemv.hip", "accuracy_level 4: A to int8 per block"),
    _ort("matmul_nbits", "qk_nbits_gemv_int8", "nbits_gemv.hip", "accuracy_level 4: the int8 product"),
    _ort("gather_block_quantized", "qk_gather_block_quantized", "gather_block_quantized.hip", "one thread per output"),
    _ort("fake_quantize", "qk_fake_quantize", "fake_quantize.hip", "one thread per element", FAKE_QUANTIZE_LEAVES),
    _ort("qswiglu", "qk_qswiglu_fused", "qswiglu.hip", "the whole chain per element"),
    _ort("qswiglu", "qk_step_dequantize", "qswiglu.hip", "unfused step: DQ"),
    _ort("qswiglu", "qk_step_sigmoid_quantize", "qswiglu.hip", "unfused step: Q(Sigmoid)"),
    _ort("qswiglu", "qk_step_mul_quantize", "qswiglu.hip", "unfused step: Q(a * b)"),
    *(
        _ort(op, symbol, "gqa.hip", doc)
        for op in ("gqa_decode", "gqa_prefill")
        for symbol, doc in (
            ("qk_gqa_append", "rotary of the new Q and K, the new K / V rows into present (quantized)"),
            ("qk_gqa_copy_past", "present rows [0, past_b) from a separate past buffer"),
            *(
                (f"qk_gqa_flash_{kind}_{loads}", f"split-K flash attention over a {kind} cache, {loads} loads")
                for kind in ("f32", "f16", "i8t", "i8c", "u4t", "u4c")
                for loads in (("words",) if kind.startswith("u4") else ("wide", "words"))
            ),
            *(
                (f"qk_gqa_mma_{kind}_h{h}", f"split-K attention on the matrix units, fp16 queries, {kind} cache, H {h}")
                for kind in ("f16", "i8t")
                for h in (16, 32, 64, 128)
            ),
            ("qk_gqa_combine", "a CTA per output row and 16 channels: the splits merged in split order, the sink"),
        )
    ),
    *(
        _ort(op, symbol, "qmoe.hip", doc)
        for op in ("qmoe_decode", "qmoe_ragged_mm")
        for symbol, doc in (
            ("qk_moe_fc1m", "fp16 input, 4-bit weights: fc1 tasks of 16 rows on the matrix units, the activation"),
            ("qk_moe_fc1m_z", "qk_moe_fc1m with packed zero points"),
            ("qk_moe_fc2m", "fp16 layer, 4-bit weights: fc2 of 16 columns a CTA, the input as three bf16 parts, mma"),
            ("qk_moe_fc2m_z", "qk_moe_fc2m with packed zero points"),
            ("qk_moe_fc1v", "input staged in shared memory, routing per CTA, fc1 tasks of 4 rows, the activation"),
            ("qk_moe_fc2v", "4 fc2 columns a lane task, the k slots summed in selection order in shared memory"),
            ("qk_moe_route", "-DQK_MOE_LEGACY: one thread per token: top-k (ties to the higher index), weights"),
            ("qk_moe_fc1", "-DQK_MOE_LEGACY: a lane group per (token, slot, unit): fc1 rows, activation"),
            ("qk_moe_fc2", "-DQK_MOE_LEGACY: a lane group per (token, column): fc2, the k slots in order"),
            ("qk_moe_quantize", "int8 activations as ORT's CPU quantizes them: a thread per block"),
        )
    ),
    *(
        _ort("qmoe_ragged_mm", symbol, "qmoe.hip", doc)
        for symbol, doc in (
            ("qk_moe_gcount", "storage=fp16 grouped path: a CTA per expert counts its live (token, slot) pairs"),
            ("qk_moe_gscatter", "storage=fp16 grouped path: scans of the counts, the stable scatter per expert"),
            ("qk_moe_stage_x", "storage=fp16 grouped path: the input as fp16 rows padded to 64 values"),
            *(
                (f"qk_moe_gemm{fc}_u{bits}", f"storage=fp16 grouped fc{fc}: 64 pairs x 64 rows, mma.m16n8k16, u{bits}")
                for fc in (1, 2)
                for bits in (2, 4, 8)
            ),
            ("qk_moe_combine", "storage=fp16 grouped path: a thread per output, the k slots in selection order"),
        )
    ),
)
GQA_PREFILL_KERNELS: tuple[KernelSpec, ...] = (
    _ort("gqa_prefill", "qk_gqa_append8", "gqa.hip", "flash prefill: the append, 8 channels a thread"),
    _ort("gqa_prefill", "qk_gqa_prefill_scratch", "gqa_flash.hip", "flash prefill: fp32 / int8 / 4-bit cache to fp16"),
    *(
        _ort("gqa_prefill", f"qk_gqa_prefill_h{h}", "gqa_flash.hip", f"flash prefill (storage=fp16), head_size {h}")
        for h in (16, 32, 64, 128)
    ),
    *(
        _ort("gqa_prefill", f"qk_gqa_prefill2_h{h}", "gqa_flash.hip", f"flash prefill v2 (storage=fp16), head_size {h}")
        for h in (64, 128)
    ),
)
"""The flash prefill (``qconform.device.ort.gqa_flash``), run under the contract storage=fp16."""
KEEP_QUANT_LEAVES = (
    "Wq4_K_Aq8_K_Yfp32",
    "Wq5_K_Aq8_K_Yfp32",
    "Wq6_K_Aq8_K_Yfp32",
    "Wq8_0_Aq8_0_Yfp32",
    "Wq3_K_Aq8_K_Yfp32",
    "Wq2_K_Aq8_K_Yfp32",
    "Wiq4_xs_Aq8_K_Yfp32",
    "Wq4_0_Aq8_0_Yfp32",
    "Wq4_1_Aq8_1_Yfp32",
    "Wq5_0_Aq8_0_Yfp32",
    "Wq5_1_Aq8_1_Yfp32",
    "Wiq4_nl_Aq8_0_Yfp32",
)
KEEP_QUANT_TYPES = ("q4_k", "q5_k", "q6_k", "q8_0", "q3_k", "q2_k", "iq4_xs", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
GGML_FUNCTION_KERNELS: tuple[KernelSpec, ...] = (
    *(
        function_kernel(
            "ggml",
            "matmul_bt_quant",
            f"qk_kq_gemv_{t}_m{mt}",
            "keep_quant.hip",
            f"{t}: rows and activations staged through shared memory, a thread's exact dp4a "
            f"{'lane sums' if t in ('q3_k', 'q4_k', 'q5_k', 'q6_k') else 'sums and fp32 terms'} per block, "
            f"then the fp32 chains in order; {mt} activation rows per CTA",
            KEEP_QUANT_LEAVES,
        )
        for t in KEEP_QUANT_TYPES
        for mt in (1, 2)
    ),
    *(
        function_kernel(
            "ggml",
            "matmul_bt_quant",
            f"qk_kq_fast_{t}_m{mt}",
            "keep_quant_fast.hip",
            f"{t} under order=any: llama.cpp mmvq's layout, 8 threads a row with 16-byte slices, dp4a sums "
            f"per sub-block scaled in fp32, {mt} activation rows per CTA",
            KEEP_QUANT_LEAVES,
        )
        for t in ("q4_k", "q5_k", "q6_k", "q8_0")
        for mt in (1, 2, 4)
    ),
    *(
        function_kernel("ggml", "matmul_bt_quant", symbol, "keep_quant.hip", doc, KEEP_QUANT_LEAVES)
        for symbol, doc in (
            ("qk_q8_k_lanes", "Q8_K quants regrouped by lane"),
            ("qk_q8_k_words", "Q8_K quants as words in element order (Q2_K, IQ4_XS)"),
            ("qk_q8_1_words", "Q8_1: Q8_0's words plus s = fp16(sum(qs) * d) from the fp32 rows"),
        )
    ),
    function_kernel(
        "ggml",
        "matmul_bt_quant",
        "qk_q8_0_quant_words",
        "q8_quant.hip",
        "Q8_0 quantize straight into aligned words, the scale as fp32",
        KEEP_QUANT_LEAVES,
    ),
    function_kernel("ggml", "rms_norm_q8_k", "qk_rms_norm_q8_k", "fused.hip", "a 256-thread CTA per Q8_K block"),
    function_kernel("ggml", "silu_mul_q8_k", "qk_silu_mul_q8_k", "fused.hip", "a 256-thread CTA per Q8_K block"),
)
"""The ggml family's kernels its function launchers run (``qconform.device.ggml.DEVICE_FUNCTIONS``)."""
BNB_KERNELS: tuple[KernelSpec, ...] = (
    function_kernel("bnb", "nf4_decode", "qk_nf4_decode", "decode.hip", "one thread per output: one nibble, one scale"),
    function_kernel("bnb", "fp4_decode", "qk_fp4_decode", "decode.hip", "one thread per output: one nibble, one scale"),
    *(
        function_kernel("bnb", f"{qt}_quantize", f"qk_{qt}_quantize{suffix}", "quantize.hip", doc)
        for qt in ("nf4", "fp4")
        for suffix, doc in (
            ("", "one thread per block: max |x|, then the midpoint count (the CPU reading)"),
            ("_cuda", "one thread per block: fmaxf, the reciprocal, the literal-threshold tree (variant=cuda)"),
        )
    ),
    function_kernel("bnb", "nested_absmax", "qk_nested_absmax", "nested.hip", "one thread per 4-bit block"),
    *(
        function_kernel("bnb", "gemm_4bit", f"qk_gemm_4bit{reading}_m{mt}", "gemm_simt.hip", doc)
        for mt in (1, 2, 4, 8, 16)
        for reading, doc in (
            ("", f"32 lanes per 2 columns, {mt} rows of A per group: weights rounded once, fmaf sums"),
            ("_simt", f"32 lanes per 2 columns, {mt} rows of A per group: gemm_4bit_simt's order (variant=cuda)"),
        )
    ),
    *(
        function_kernel(
            "bnb", "gemm_4bit", f"qk_gemm_4bit_mma_n{nt}{suffix}", "gemm_mma.hip",
            f"mma.sync m16n8k16, {16 * rt} weight rows x {8 * nt} tokens a CTA ({rt} 16-row tiles a warp step), K "
            f"over 8 warps: cpu reading, M <= {8 * nt}",
        )  # fmt: skip
        for nt, rt, suffix in ((1, 2, ""), (1, 1, "_r1"), (2, 2, ""))
    ),
)
"""The bitsandbytes family's kernels (``qconform.device.bnb``)."""
TOOL_KERNELS: tuple[tuple[str, str, str], ...] = (
    ("bnb/rcp.hip", "qk_rcp_table", "the device's approximate reciprocal over [1, 2), as the oracle's int8 table"),
    ("bnb/rcp.hip", "qk_rcp_scaled", "the device's approximate reciprocal of given floats (the table's rule checked)"),
)
"""(source, symbol, doc) of kernels that implement no op: measurements of the device that the
oracles take as parameters (``qconform.device.bnb.rcp``)."""
KERNELS: tuple[KernelSpec, ...] = (
    *GGML_KERNELS,
    *GGML_FUNCTION_KERNELS,
    *BNB_KERNELS,
    *ORT_KERNELS,
    *GQA_PREFILL_KERNELS,
    *_mma_symbols(),
)
"""Every kernel qconform ships (an offline test checks each symbol exists in its source)."""
