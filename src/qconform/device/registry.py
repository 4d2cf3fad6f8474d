"""Every device kernel qconform ships, with its launch geometry. Imports no CuPy.

Launch ABI, shared by our kernels and a user's ``hip:`` kernel (README "Kernel ABIs"):
``extern "C" __global__ void k(const void* in, void* out, long long n_blocks)`` launched with
``blockDim.x = threads`` and ``gridDim.x = ceil(n_blocks * lanes / threads)``, where ``n_blocks``
is the number of format blocks (Q8_K: 256 values, Q8_0: 32) and ``lanes`` the threads a kernel
spends on one format block.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qconform.errors import ArgumentError

KERNEL_DIR = Path(__file__).parent / "kernels"
COMMON_DIR = KERNEL_DIR / "common"  # headers every kernel may include (on the include path)
MAX_GRID_X = 2**31 - 1


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
    source: str  # file under kernels/
    geometry: Geometry
    doc: str

    @property
    def path(self) -> Path:
        return KERNEL_DIR / self.source


KERNELS: tuple[KernelSpec, ...] = (
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
)

VARIANTS = tuple(dict.fromkeys(k.variant for k in KERNELS))


def kernel_for(op: str, variant: str | None = None) -> KernelSpec:
    """The kernel of ``op`` in ``variant`` (None: the first listed); an op with one kernel uses it
    for every variant."""
    mine = [k for k in KERNELS if k.op == op]
    if not mine:
        raise ArgumentError(f"op: no device kernel for {op!r}; kernels exist for {sorted({k.op for k in KERNELS})}")
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


def parse_source_spec(spec: str) -> tuple[Path, str, Geometry]:
    """``hip:path/file.hip:symbol[:lanes=N][:threads=N]`` -> (path, symbol, geometry)."""
    body = spec.split(":", 1)[1] if ":" in spec else ""
    parts = body.split(":")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise ArgumentError(
            f"impl: hip: implementations are 'hip:path/file.hip:symbol[:lanes=N][:threads=N]', got {spec!r}"
        )
    opts: dict[str, int] = {}
    for item in parts[2:]:
        key, sep, value = item.partition("=")
        if not sep or key not in ("lanes", "threads") or not value.isdigit() or int(value) < 1:
            raise ArgumentError(f"impl: {spec!r}: options are lanes=N and threads=N (positive), got {item!r}")
        opts[key] = int(value)
    path = Path(parts[0])
    if not path.is_file():
        raise ArgumentError(f"impl: no such kernel source {parts[0]!r}")
    return path, parts[1], Geometry(**opts)


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

    def symbol(self, bits: int) -> str:
        return f"qk_nbits_mma_u{bits}_r{self.r}_t{self.t}_p{self.p}_o{self.o}"

    def k_split(self, items: int, n_chunks: int, regs: int, sms: int) -> int:
        """The most warps per item (1, 2, 4, 8) that keeps the launch within ``warps_per_sm``
        warps per SM and every CTA resident at once (one wave, from the kernel's registers),
        with at least 2p chunks per warp."""
        if self.wk:
            return self.wk
        best = 1
        for wk in (2, 4, 8):
            warps = wk * self.wi
            per_sm = min(32, 64 // warps, 65536 // (-(-regs // 8) * 8 * 32 * warps))
            one_wave = -(-items // self.wi) <= per_sm * sms
            if one_wave and items * wk <= self.warps_per_sm * sms and n_chunks >= 2 * wk * self.p:
                best = wk
        return best


MMA_SHAPES = {
    "decode": MmaShape(r=2, t=1, p=2, o=1),
    "prefill": MmaShape(r=2, t=4, p=2, o=1, wk=1, wi=4),
}
"""decode: M <= 8 (one group of 8 tokens); prefill: larger M. The shapes the device suite ran
(docs/perf-notes.md has the bench's times for every candidate)."""
MMA_DECODE_CANDIDATES = tuple(
    MmaShape(r, 1, p, o) for r, p, o in ((2, 2, 1), (2, 2, 3), (2, 4, 2), (4, 2, 2), (1, 4, 4))
)
"""The decode shapes the GEMV bench times (each also at several ``warps_per_sm``)."""
