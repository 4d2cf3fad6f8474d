"""The worked user kernels (examples/) run as a user would run them, each beside its wrong twin:
a `hip:` GEMV for matmul_nbits, a `hip:` Q4_0 dequantizer, a naive `hip:` GQA decode, `so:` launchers for
gather_block_quantized and for QMoE (qconform's own QMoE kernels behind the C ABI) and a PyTorch
device `py:` drop-in for matmul_nbits. A correct kernel must PASS every selected leaf with at least
one case run (declined cases only where its entry declares them); a twin must FAIL with the
property its entry names: a matches_oracle failure must name an element (``at [i, j] ...: got X,
want Y``), a survives_pending_error failure must be about the foreign error the suite planted.

    python3 tests/user_kernels.py [--coverage N] [--only NAME] [--no-cold]
        # a GPU: prints a markdown table, exits 1 on any unexpected outcome
Used by tests/test_user_kernels.py (the same table under pytest, marker ``device``)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
REPO = HERE.parent
EXAMPLES = REPO / "examples"

MATMUL_LEAVES = (
    "Xfp16_Wu2_Yfp16",
    "Xfp16_Wu3_Yfp16",
    "Xfp16_Wu4_Yfp16",
    "Xfp16_Wu8_Yfp16",
    "Xfp32_Wu2_Yfp32",
    "Xfp32_Wu3_Yfp32",
    "Xfp32_Wu4_Yfp32",
    "Xfp32_Wu8_Yfp32",
)
GATHER_LEAVES = ("Xi64_Wu4_Yfp16", "Xi64_Wu8_Yfp16", "Xi64_Wi4_Yfp16", "Xi64_Wfp8_Yfp16")
GEMV_REQUIRES = "bits==2 and accuracy_level<4"

# a matches_oracle failure that names an element: exact checks say "first at [i, j] (...): got X,
# want Y", bound checks "worst at [i, j] (row i, column j): got X, want Y"
NAMES_ELEMENT = re.compile(r"at \[\d+(?:, \d+)*\][^:]*: got .+, want .+")


@dataclass(frozen=True)
class UserKernel:
    name: str
    source: str  # repo path of the example
    symbol: str  # the kernel / launcher / callable
    op: str
    leaves: tuple[str, ...]
    expect: str  # "PASS", or the property that must fail ("matches_oracle")
    requires: str = ""  # a hip:/so: requires= predicate
    declines: bool = False  # declined cases allowed (what requires= or the drop-in declines)
    cold: bool = True  # also the cold input sets (larger than the L2) of an op that has them

    @property
    def kind(self) -> str:
        return {".hip": "hip", ".cu": "so", ".py": "py"}[Path(self.source).suffix]

    def impl_spec(self, built: dict[str, Path]) -> str:
        """The --impl string; ``built`` maps so: sources to their compiled libraries."""
        path = built[self.source] if self.kind == "so" else REPO / self.source
        return f"{self.kind}:{path}:{self.symbol}" + (f":requires={self.requires}" if self.requires else "")


GEMV = "examples/hip_kernel/matmul_nbits_u2_gemv.hip"
GATHER = "examples/so_launcher/gather_block_quantized_launcher.cu"
TORCH = "examples/torch_dropin/matmul_nbits_torch.py"
Q4_0_DEQUANT = "examples/hip_kernel/q4_0_dequant.hip"
GQA_NAIVE = "examples/hip_kernel/gqa_decode_naive.hip"
GQA_FLOAT_LEAVES = ("Xfp16_Wfp16_Yfp16", "Xfp32_Wfp32_Yfp32")
GQA_REQUIRES = "kv_cache_bit_width==0"
QMOE = "examples/so_launcher/qmoe_launcher.cu"
QMOE_LEAVES = ("Xfp16_Wu4_Yfp16", "Xfp16_Wu8_Yfp16", "Xfp32_Wu4_Yfp32")
QMOE_TWIN = "so: QMoE launcher, wrong twin (returns cudaGetLastError())"
ENTRIES = (
    UserKernel(
        "hip: u2 GEMV",
        GEMV,
        "matmul_nbits_u2_gemv",
        "matmul_nbits",
        ("Xfp16_Wu2_Yfp16", "Xfp32_Wu2_Yfp32"),
        "PASS",
        GEMV_REQUIRES,
        declines=True,  # accuracy_level 4 (coverage 2)
    ),
    UserKernel(
        "hip: u2 GEMV, wrong twin (fields high bits first)",
        GEMV.replace(".hip", "_wrong.hip"),
        "matmul_nbits_u2_gemv",
        "matmul_nbits",
        ("Xfp16_Wu2_Yfp16", "Xfp32_Wu2_Yfp32"),
        "matches_oracle",
        GEMV_REQUIRES,
        declines=True,
    ),
    UserKernel("hip: Q4_0 dequantize", Q4_0_DEQUANT, "q4_0_dequant", "q4_0_dequant", ("Xq4_0_Yfp32",), "PASS"),
    UserKernel(
        "hip: Q4_0 dequantize, wrong twin (nibbles swapped)",
        Q4_0_DEQUANT.replace(".hip", "_wrong.hip"),
        "q4_0_dequant",
        "q4_0_dequant",
        ("Xq4_0_Yfp32",),
        "matches_oracle",
    ),
    UserKernel(
        "hip: naive GQA decode",
        GQA_NAIVE,
        "gqa_decode_naive",
        "gqa_decode",
        GQA_FLOAT_LEAVES,
        "PASS",
        GQA_REQUIRES,
        declines=True,  # the quantized caches' cases (requires=)
        cold=False,  # one thread per output walking every key: the cold sets' long contexts take minutes
    ),
    UserKernel(
        "hip: naive GQA decode, wrong twin (window of W + 1 keys)",
        GQA_NAIVE.replace(".hip", "_wrong.hip"),
        "gqa_decode_naive",
        "gqa_decode",
        GQA_FLOAT_LEAVES,
        "matches_oracle",
        GQA_REQUIRES,
        declines=True,
    ),
    UserKernel(
        "so: gather launcher",
        GATHER,
        "gather_block_quantized_launcher",
        "gather_block_quantized",
        GATHER_LEAVES,
        "PASS",
    ),
    UserKernel(
        "so: gather launcher, wrong twin (negative indices not wrapped)",
        GATHER.replace(".cu", "_wrong.cu"),
        "gather_block_quantized_launcher",
        "gather_block_quantized",
        GATHER_LEAVES,
        "matches_oracle",
    ),
    *(
        UserKernel(
            f"so: QMoE launcher ({op})",
            QMOE,
            "qmoe_launcher",
            op,
            QMOE_LEAVES,
            "PASS",
            cold=False,  # the same kernels' cold sets run under --impl cupy (tests/test_device.py)
        )
        for op in ("qmoe_decode", "qmoe_ragged_mm")
    ),
    *(
        UserKernel(
            f"{QMOE_TWIN}, {op}",
            QMOE.replace(".cu", "_wrong.cu"),
            "qmoe_launcher",
            op,
            ("Xfp16_Wu8_Yfp16",),  # every case passes matches_oracle: one leaf shows the pending-error failure
            "survives_pending_error",
        )
        for op in ("qmoe_decode", "qmoe_ragged_mm")
    ),
    UserKernel(
        "py: PyTorch drop-in",
        TORCH,
        "matmul_nbits",
        "matmul_nbits",
        MATMUL_LEAVES,
        "PASS",
        declines=True,  # accuracy_level 4 with integer zero points (coverage 2)
        cold=False,  # 8 leaves of 3 cold sets: minutes of oracle time (qconform run checks them)
    ),
    UserKernel(
        "py: PyTorch drop-in, wrong twin (default zero point 8)",
        TORCH.replace(".py", "_wrong.py"),
        "matmul_nbits",
        "matmul_nbits",
        ("Xfp16_Wu2_Yfp16", "Xfp32_Wu8_Yfp32"),  # 4-bit leaves agree: 2^(4-1) = 8
        "matches_oracle",
        declines=True,
    ),
)


def build_all(out_dir: Path, entries: tuple[UserKernel, ...] = ENTRIES) -> dict[str, Path]:
    """Compile every so: example for this machine's GPU (qconform.device.solib.build_launcher)."""
    from qconform.device.loader import device_info
    from qconform.device.solib import build_launcher

    info = device_info()
    vendor = "amd" if info.is_hip else "nvidia"
    built: dict[str, Path] = {}
    for e in entries:
        if e.kind == "so" and e.source not in built:
            lib = out_dir / (Path(e.source).stem + ".so")
            built[e.source] = build_launcher(REPO / e.source, lib, vendor=vendor, arch=info.arch)
    return built


def run_entry(e: UserKernel, built: dict[str, Path], coverage: int = 2, cold: bool = True) -> list[Any]:
    """Run the suite on every leaf of one entry; returns the LeafResults. Twins skip the cold
    input sets (they fail on the cases already), and so does every entry with ``cold=False``."""
    from qconform.impls import load_impl
    from qconform.ops import get_op
    from qconform.properties.checks import Prepared
    from qconform.properties.suite import run_leaf

    op = get_op(e.op)
    impl = load_impl(e.impl_spec(built), [e.op])
    results = []
    for leaf in e.leaves:
        prepared = [Prepared.from_case(op, c, impl) for c in op.cases(leaf, coverage)]
        results.append(run_leaf(impl, op, leaf, prepared, cold=cold and e.cold and e.expect == "PASS"))
    return results


def verdict(e: UserKernel, result: Any) -> tuple[bool, str]:
    """(as expected, what happened) for one leaf's LeafResult."""
    failed = sorted({o.prop for o in result.failed})
    declined = len(result.declined)
    counts = f"{result.ran} ran, {declined} declined"
    if e.expect == "PASS":
        if result.verdict != "PASS":
            first = result.failed[0].detail[:160] if result.failed else result.skipped or "no case ran"
            return False, f"{result.verdict} {failed} ({counts}): {first}"
        if declined and not e.declines:
            return False, f"PASS but declined {declined} cases it does not declare ({counts})"
        warned = [o.detail for o in result.outcomes if o.prop == "survives_pending_error" and "WARNING" in o.detail]
        return True, f"PASS ({counts})" + (f"; {warned[0]}" if warned else "")
    if e.expect not in failed:
        return False, f"{result.verdict}, {e.expect} not failed: {failed} ({counts}) (MISSED)"
    details = [o.detail for o in result.failed if o.prop == e.expect]
    if e.expect == "survives_pending_error":  # caught for the error the suite planted, not another
        named = [d for d in details if "foreign" in d]
        if not named:
            return False, f"FAIL {failed}, but no {e.expect} detail is about the foreign error: {details[0][:160]}"
        return True, f"FAIL {failed} ({counts}): {named[0][:160]}"
    named = [d for d in details if NAMES_ELEMENT.search(d)]
    if not named:
        return False, f"FAIL {failed}, but no {e.expect} detail names an element: {details[0][:160]}"
    return True, f"FAIL {failed} ({counts}): {named[0][:160]}"


def main(argv: list[str]) -> int:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description="Run the worked user kernels and their wrong twins (a GPU).")
    parser.add_argument("--coverage", type=int, default=2, help="case coverage (1 quick, 2 CI, 3 full)")
    parser.add_argument("--only", action="append", default=[], help="run the entries whose name contains this")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold input sets (faster)")
    args = parser.parse_args(argv)
    entries = tuple(e for e in ENTRIES if not args.only or any(s in e.name for s in args.only))
    print("| user kernel | op | leaf | expected | result | |")
    print("|---|---|---|---|---|---|", flush=True)
    bad, total = 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        built = build_all(Path(tmp), entries)
        for e in entries:  # rows stream as each entry finishes, so a cut-off run still shows them
            for leaf, result in zip(e.leaves, run_entry(e, built, args.coverage, not args.no_cold), strict=True):
                ok, what = verdict(e, result)
                total += 1
                bad += not ok
                what, mark = what.replace("|", "\\|"), "ok" if ok else "UNEXPECTED"
                print(f"| {e.name} | {e.op} | {leaf} | {e.expect} | {what} | {mark} |", flush=True)
    print(f"user kernels as expected: {total - bad}/{total} leaves")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.exit(main(sys.argv[1:]))
