"""The device mutants and the control kernels beside them, one row each: what is loaded, which
op it runs, and the property that must catch it (None: a control that must pass). Used by
tests/test_device.py and by ci/device.sh (``python3 tests/device_catalogue.py`` prints the
caught/missed table)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
MUTANT_DIR = HERE / "device_mutants"
REPO = HERE.parent


@dataclass(frozen=True)
class DeviceMutant:
    name: str
    source: str  # file in tests/device_mutants (or a repo path)
    symbol: str
    options: str  # the hip: geometry suffix, "" for so: launchers
    op: str
    caught_by: str | None  # the property that must fail; None for a control that must pass
    warning: bool = False  # a control whose pending-error outcome must carry a warning
    leaf: str | None = None  # None: the op's first leaf
    coverage: int = 1

    @property
    def is_so(self) -> bool:
        return self.source.endswith(".cu")

    @property
    def is_ort(self) -> bool:
        """qconform's own ORT kernels (--impl cupy) compiled with ``options`` (-D defines)."""
        return self.source == "ort/nbits_mma.hip"

    def path(self) -> Path:
        if self.is_ort:
            return REPO / "src/qconform/device/kernels" / self.source
        return (REPO / self.source) if "/" in self.source else MUTANT_DIR / self.source


HIP_MUTANTS = (
    DeviceMutant(
        "ties away from zero", "q8_k_ties_away.hip", "qk_q8_k_quant_coop", ":lanes=8", "q8_k_quant", "matches_oracle"
    ),
    DeviceMutant(
        "coop ties to the higher index",
        "q8_k_coop_ties_high.hip",
        "qk_q8_k_quant_coop",
        ":lanes=8",
        "q8_k_quant",
        "matches_oracle",
    ),
    DeviceMutant(
        "coop amax race (no barrier)",
        "q8_k_smem_amax.hip",
        "mutant_q8k_smem_amax_race",
        ":lanes=8",
        "q8_k_quant",
        "matches_oracle",
    ),
    DeviceMutant(
        "last partial grid block skipped",
        "q8_k_skip_last_block.hip",
        "mutant_q8_k_skip_last",
        ":lanes=8",
        "q8_k_quant",
        "writes_every_output",
    ),
    DeviceMutant(
        "control: smem amax with barrier", "q8_k_smem_amax.hip", "q8k_smem_amax", ":lanes=8", "q8_k_quant", None
    ),
    DeviceMutant(
        "control: coop kernel, 64-thread CTAs",
        "src/qconform/device/kernels/ggml/q8_quant.hip",
        "qk_q8_k_quant_coop",
        ":lanes=8:threads=64",
        "q8_k_quant",
        None,
    ),
)
SO_MUTANTS = (
    DeviceMutant(
        "so: returns cudaGetLastError()",
        "so_returns_last_error.cu",
        "qk_q8_k_quantize",
        "",
        "q8_k_quant",
        "survives_pending_error",
    ),
    DeviceMutant(
        "so: reports a failed launch as 0",
        "so_ignores_status.cu",
        "qk_q8_k_quantize",
        "",
        "q8_k_quant",
        "survives_pending_error",
    ),
    DeviceMutant(
        "so: clears the error on entry (by design)",
        "so_clears_on_entry.cu",
        "qk_q8_k_quantize",
        "",
        "q8_k_quant",
        None,
        warning=True,
    ),
    DeviceMutant(
        "so: worked example (examples/so_launcher)",
        "examples/so_launcher/q8_k_launcher.cu",
        "qk_q8_k_quantize",
        "",
        "q8_k_quant",
        None,
    ),
)


def _mma(name: str, define: str, caught_by: str | None, leaf: str = "Xfp16_Wu2_Yfp16") -> DeviceMutant:
    options = f"{define} -DQK_MMA_DEFAULT_ONLY"  # the launcher's shapes only: a faster build
    return DeviceMutant(name, "ort/nbits_mma.hip", "", options, "matmul_nbits", caught_by, leaf=leaf, coverage=2)


ORT_MUTANTS = (
    _mma("mma GEMV: last chunk reads the previous block's scale", "-DQK_MUT_MMA_LAST_SCALE", "matches_oracle"),
    _mma("mma GEMV: activation pairs in swapped K slots", "-DQK_MUT_MMA_SLOT_SWAP", "matches_oracle"),
    _mma("mma GEMV: last K split not added", "-DQK_MUT_MMA_DROP_LAST_WARP", "matches_oracle", leaf="Xfp16_Wu4_Yfp16"),
    _mma("control: portable mma (shuffles), u2", "-DQK_MMA_EMULATE", None),
    _mma("control: portable mma (shuffles), u4", "-DQK_MMA_EMULATE", None, leaf="Xfp16_Wu4_Yfp16"),
)
ALL = HIP_MUTANTS + SO_MUTANTS + ORT_MUTANTS


def impl_spec(m: DeviceMutant, built: dict[str, Path]) -> str:
    """The --impl string for a mutant; ``built`` maps so: sources to their compiled libraries."""
    if m.is_ort:
        return "cupy"
    if m.is_so:
        return f"so:{built[m.source]}:{m.symbol}"
    return f"hip:{m.path()}:{m.symbol}{m.options}"


def build_all(out_dir: Path) -> dict[str, Path]:
    """Compile every so: source for this machine's GPU."""
    from qconform.device.loader import device_info
    from qconform.device.solib import build_launcher

    info = device_info()
    vendor = "amd" if info.is_hip else "nvidia"
    built = {}
    for m in SO_MUTANTS:
        if m.source not in built:
            lib = out_dir / (Path(m.source).stem + ".so")
            built[m.source] = build_launcher(m.path(), lib, vendor=vendor, arch=info.arch)
    return built


def run_mutant(m: DeviceMutant, built: dict[str, Path], coverage: int = 1):
    """Run the suite on one mutant; returns the LeafResult."""
    from qconform.impls import load_impl
    from qconform.ops import get_op
    from qconform.properties.checks import Prepared
    from qconform.properties.suite import run_leaf

    op = get_op(m.op)
    impl = load_impl(impl_spec(m, built), [m.op])
    leaf = m.leaf or op.leaves[0].name
    prepared = [Prepared.from_case(op, c, impl.ftz) for c in op.cases(leaf, max(coverage, m.coverage))]
    if not m.is_ort:
        return run_leaf(impl, op, leaf, prepared)
    from qconform.device import ort as ort_launch

    with ort_launch.compile_options(*m.options.split()):
        return run_leaf(impl, op, leaf, prepared)


def verdict(m: DeviceMutant, result) -> tuple[bool, str]:
    """(as expected, what happened) for one mutant's LeafResult."""
    failed = sorted({o.prop for o in result.failed})
    pending = [o for o in result.outcomes if o.prop == "survives_pending_error"]
    warned = any("WARNING" in o.detail for o in pending)
    if m.caught_by is None:
        ok = not failed and (warned == m.warning)
        what = "passed" + (" with a warning" if warned else "") if not failed else f"failed {failed}"
        return ok, what
    return m.caught_by in failed, f"failed {failed}" if failed else "passed (MISSED)"


def main() -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        built = build_all(Path(tmp))
        rows, missed = [], 0
        for m in ALL:
            ok, what = verdict(m, run_mutant(m, built))
            missed += not ok
            expect = m.caught_by or ("pass, warning" if m.warning else "pass")
            rows.append(f"| {m.name} | {expect} | {what} | {'ok' if ok else 'UNEXPECTED'} |")
    print("| device mutant / control | expected | result | |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    print(f"mutants and controls as expected: {len(ALL) - missed}/{len(ALL)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.exit(main())
