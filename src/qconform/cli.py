"""``qconform run | fuzz | golden | bench | list | abi``. Exit status: 0 passed, 1 a failure, 2 usage or
environment error."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import zlib
from pathlib import Path
from typing import Any, Sequence

import qconform
from qconform.device.registry import KERNELS
from qconform.errors import ArgumentError
from qconform.impls import (
    BUILTIN_IMPLS,
    DEVICE_IMPLS,
    CallableImpl,
    Implementation,
    OracleImpl,
    device_available,
    gpu_count,
    load_impl,
)
from qconform.ops import CATALOGUE, Case, OpSpec, get_op
from qconform.properties.checks import DEFAULT_REPEAT_CALLS, Prepared
from qconform.properties.suite import LeafResult, run_leaf
from qconform.report import MAX_FAILURES_SHOWN, RENDERERS, TextStream, render

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """A usage or environment problem: exit status 2."""


def _op_names(values: Sequence[str] | None) -> list[str] | None:
    if not values:
        return None
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    for n in names:
        get_op(n)
    return names


def _selected(impl: Implementation, ops: list[str] | None, leaf: str | None) -> list[tuple[OpSpec, str]]:
    chosen = [get_op(n) for n in ops] if ops else [op for op in CATALOGUE.values() if impl.applies_to(op)]
    pairs = [(op, lf.name) for op in chosen for lf in op.leaves if leaf in (None, lf.name)]
    if not pairs:
        valid = ", ".join(lf.name for op in chosen for lf in op.leaves)
        raise UsageError(f"--leaf: no leaf {leaf!r} in {', '.join(op.name for op in chosen)}; leaves: {valid}")
    return pairs


def find_case(text: str, ops: list[str] | None, leaf: str | None) -> tuple[OpSpec, Case]:
    """A case from ``--case``: its JSON (which names its op), or its id, looked up among the
    cases of every coverage of the selected ops and leaf."""
    if text.lstrip().startswith("{"):
        try:
            case = Case.from_json(text)
            op = get_op(case.op)
            op.leaf(case.leaf)
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--case: not a case ({type(exc).__name__}: {exc})") from exc
        if ops and case.op not in ops:
            raise UsageError(f"--case is for op {case.op}, not {', '.join(ops)}")
        return op, case
    for op in [get_op(n) for n in ops] if ops else CATALOGUE.values():
        for lf in op.leaves:
            if leaf not in (None, lf.name):
                continue
            for coverage in (1, 2, 3):
                for case in op.cases(lf.name, coverage):
                    if case.id == text:
                        return op, case
    raise UsageError(f"--case: no case with id {text!r} in the selected ops (pass its JSON, or --ops/--leaf)")


def _check_out_path(out: str | None, flag: str = "--out") -> None:
    """An output file's folder must exist before a long run starts (its results would be lost)."""
    if out and not Path(out).resolve().parent.is_dir():
        raise UsageError(f"{flag}: the folder of {out!r} does not exist")


def _golden_integrity(golden_dir: Path, integrity: Any) -> tuple[Any, Any]:
    """A golden set's integrity findings; a missing or unreadable manifest is a usage error."""
    if not (golden_dir / "MANIFEST.json").is_file():
        raise UsageError(f"{golden_dir} has no MANIFEST.json")
    try:
        return integrity(golden_dir)
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise UsageError(f"{golden_dir}/MANIFEST.json is unreadable ({type(exc).__name__}: {exc})") from exc


class Progress:
    """A one-line progress bar on stderr when it is a terminal; silent otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = max(total, 1), 0, enabled and sys.stderr.isatty()
        self.label = ""

    def step(self) -> None:
        self.done += 1
        if self.enabled:
            filled = int(30 * self.done / self.total)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {self.label[:50]:50}")
            sys.stderr.flush()

    def clear(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()

    close = clear


def _emit(text: str, out: str | None) -> None:
    if out:
        Path(out).write_text(text)
        print(f"wrote {out}")
    else:
        sys.stdout.write(text)


class LazyCases:
    """A leaf's cases, their inputs and oracle outputs generated only when the leaf runs (a
    coverage-3 run holds one leaf's inputs in memory, not every leaf's)."""

    def __init__(self, op: OpSpec, cases: list[Case], impl: Implementation) -> None:
        self.op, self.cases, self.impl = op, cases, impl

    def __len__(self) -> int:
        return len(self.cases)

    def __iter__(self) -> Any:
        return (Prepared.from_case(self.op, c, self.impl) for c in self.cases)


def _run_prepared(
    impl: Implementation,
    groups: list[tuple[OpSpec, str, list[Prepared]]],
    repeat_calls: int,
    show_progress: bool,
    cold: bool = True,
    on_leaf: Any = None,
) -> tuple[list[LeafResult], bool]:
    """Run every leaf; ``on_leaf(result)`` as each finishes. (results, interrupted): Ctrl-C stops
    the run and keeps what finished."""
    progress = Progress(sum(len(p) for _, _, p in groups), show_progress)
    results: list[LeafResult] = []
    try:
        for k, (op, leaf, prepared) in enumerate(groups):
            progress.label = f"{op.name} {leaf}"
            if not progress.enabled:  # a CI log: a line per leaf as it starts
                print(f"[{k + 1}/{len(groups)}] {op.name} {leaf}: {len(prepared)} cases", file=sys.stderr, flush=True)
            cases = list(prepared)  # generated now: one leaf's inputs in memory at a time
            r = run_leaf(impl, op, leaf, cases, repeat_calls=repeat_calls, progress=progress.step, cold=cold)
            del cases
            results.append(r)
            progress.clear()
            if on_leaf is not None:
                on_leaf(r)
    except KeyboardInterrupt:
        progress.close()
        return results, True
    progress.close()
    return results, False


def cmd_run(args: argparse.Namespace) -> int:
    from qconform.golden import default_sets
    from qconform.golden.store import decode_leaf
    from qconform.golden.verify import integrity

    ops = _op_names(args.ops)
    _check_out_path(args.out)
    parse_shard(args.shard) if args.shard else None
    found, why = device_available()
    if args.sanitize:
        return run_sanitized(args, ops)
    workers = _workers(args, found)
    if workers > 1:
        return run_in_workers(args, workers, on_device=found and (args.impl is None or _is_device(args.impl)))
    context: dict[str, Any] = {"qconform": qconform.__version__}
    golden_dirs = [Path(args.golden)] if args.golden else []
    if args.impl is None and found:
        impl: Implementation = load_impl("cupy", contract=args.contract)
        print(f"GPU found ({why}): checking qconform's device kernels (--impl cupy) on {impl.arch}.", flush=True)
        context["device"] = _device_line()
    elif args.impl is None:
        print(f"No GPU device found ({why}): checking the oracle against the committed golden sets.", flush=True)
        impl = load_impl("oracle", contract=args.contract)
        golden_dirs = golden_dirs or default_sets()
        if not golden_dirs:
            raise UsageError("no golden set found; pass --golden DIR or --impl")
        context["device"] = f"none ({why})"
    else:
        impl = _isolated(load_impl(args.impl, ops, args.contract), args, ops)
        context["device"] = _device_line() if impl.on_device else ("found, not used" if found else f"none ({why})")
    context["impl"] = impl.name
    context["contract"] = str(impl.contract)

    if args.case:
        op, case = find_case(args.case, ops, args.leaf)
        groups = [(op, case.leaf, [Prepared.from_case(op, case, impl)])]
        context["cases"] = f"replay {case.id}"
    elif golden_dirs:
        groups, seen = [], set()
        for one in golden_dirs:  # newest first: each leaf from the newest set holding it
            findings, intact = _golden_integrity(one, integrity)
            for f in findings:
                print(f"GOLDEN {f.kind.upper()} {f.path}: {f.detail}", file=sys.stderr)
            if findings:
                print(f"golden set {one} failed its integrity check", file=sys.stderr)
                return EXIT_FAIL
            for data in intact.values():
                leaf = decode_leaf(data)
                if (
                    (leaf.op.name, leaf.leaf) in seen
                    or (ops and leaf.op.name not in ops)
                    or (args.leaf and leaf.leaf != args.leaf)
                    or not impl.applies_to(leaf.op)
                ):
                    continue
                seen.add((leaf.op.name, leaf.leaf))
                groups.append((leaf.op, leaf.leaf, [p.for_impl(leaf.op, impl) for p in leaf.prepared]))
        order = {
            (op.name, lf.name): i for i, (op, lf) in enumerate((o, lf) for o in CATALOGUE.values() for lf in o.leaves)
        }
        groups.sort(key=lambda g: order.get((g[0].name, g[1]), len(order)))  # catalogue order across sets
        context["cases"] = f"golden {', '.join(str(d) for d in golden_dirs)}"
    else:
        groups = [
            (op, leaf, LazyCases(op, op.cases(leaf, args.coverage), impl))
            for op, leaf in _selected(impl, ops, args.leaf)
        ]
        context["cases"] = f"coverage {args.coverage}"
    if not groups:
        raise UsageError("nothing to run for this selection")
    groups = shard(groups, args.shard)
    if args.shard:
        context["shard"] = f"{args.shard} ({len(groups)} leaves)"
    if args.coverage == 3 and not args.case and not golden_dirs:
        coverage_3_plan(groups)
    max_failures = None if args.all_failures else args.max_failures
    stream = None
    if args.format == "text" and not args.out:
        stream = TextStream(_stdout_write, context, [(op.name, leaf) for op, leaf, _ in groups], impl.arch)
    progress = args.format == "text" and not args.out
    results, interrupted = _run_prepared(
        impl, groups, args.repeat_calls, progress, not args.no_cold, stream.row if stream else None
    )
    note = f"interrupted after {len(results)} of {len(groups)} leaves" if interrupted else ""
    if stream is not None:
        stream.end(results, max_failures, note)
    else:
        extra = {"interrupted": note} if note else {}
        _emit(render(results, args.format, {**context, **extra}, max_failures), args.out)
    if interrupted:
        return EXIT_INTERRUPTED
    if not groups:
        print(f"shard {args.shard}: no leaf falls to this shard", file=sys.stderr)
        return EXIT_OK
    if all(r.verdict == "SKIP" for r in results):
        why = "declined every case" if any(r.declined for r in results) else "implements none of the selected ops"
        print(f"{impl.name} {why}: nothing ran", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_FAIL if any(r.verdict == "FAIL" for r in results) else EXIT_OK


def _isolated(impl: Implementation, args: argparse.Namespace, ops: list[str] | None) -> Implementation:
    """A user's CPU drop-in runs in a worker process under ``--timeout`` (a hang or a crash is a
    failure of that case, not of the run), unless ``--in-process``."""
    from qconform.impls.worker import WorkerImpl

    if isinstance(impl, CallableImpl) and not isinstance(impl, OracleImpl) and not args.in_process:
        return WorkerImpl(impl, args.impl, ops, args.timeout)  # type: ignore[return-value]
    return impl


def _contract_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--contract",
        help="what the implementation relaxes from the upstream reference, KEY=VALUE,...: accumulate=fp32|fp16|bf16, "
        "chain=N|K/D, storage=exact|fp16|bf16, ftz=as-built|on|off|either, nan=reference|ieee|unsupported, "
        "division=exact|Nulp, level4=either|int8|float, bound=probabilistic|worst-case, variant=cpu|cuda|rocm, "
        "order=reference|any, fma=off|on|either (docs/contracts.md; default strict)",
    )


def _is_device(spec: str) -> bool:
    return spec == "cupy" or spec.startswith(("cupy:", "hip:", "so:"))


def _workers(args: argparse.Namespace, gpu_found: bool) -> int:
    """``--workers``: a number, or ``auto`` (one per visible GPU for a device run, else 1)."""
    if args.workers == "auto":
        if not gpu_found or args.case or args.shard or not (args.impl is None or _is_device(args.impl)):
            return 1
        return max(1, gpu_count())
    if not args.workers.isdigit() or int(args.workers) < 1:
        raise UsageError(f"--workers: a positive number or auto, got {args.workers!r}")
    if int(args.workers) > 1 and (args.shard or args.case):
        raise UsageError("--workers splits the run into shards itself: not with --shard or --case")
    return int(args.workers)


def run_in_workers(args: argparse.Namespace, n: int, on_device: bool) -> int:
    """Run shard i/n in worker process i (pinned to GPU i-1 on a device run), then print the
    merged table: each worker writes a JSON report, ``qconform report merge`` style."""
    import subprocess
    import tempfile

    from qconform.report import from_json

    argv = [a for a in ARGV if a != "--all-failures"]
    argv = _drop_options(argv, ("--workers", "--format", "--out", "--max-failures"))
    visible = "HIP_VISIBLE_DEVICES" if on_device and _hip() else "CUDA_VISIBLE_DEVICES"
    gpus = max(1, gpu_count()) if on_device else 1
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for i in range(1, n + 1):
            report = Path(tmp) / f"shard{i}.json"
            env = {**os.environ, **({visible: str((i - 1) % gpus)} if on_device else {})}
            cmd = [sys.executable, "-m", "qconform", *argv, "--shard", f"{i}/{n}", "--workers", "1"]
            cmd += ["--format", "json", "--out", str(report)]
            procs.append((report, subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)))
        results: list[LeafResult] = []
        for report, proc in procs:
            code = proc.wait()
            if code in (EXIT_USAGE, EXIT_INTERRUPTED) or not report.is_file():
                return code if code else EXIT_USAGE
            results += from_json(json.loads(report.read_text()))
    context = {"qconform": qconform.__version__, "workers": f"{n}" + (" (one per GPU)" if on_device else "")}
    _emit_results(results, args, context)
    if all(r.verdict == "SKIP" for r in results):
        return EXIT_USAGE
    return _status(results)


SANITIZER = "compute-sanitizer"


def run_sanitized(args: argparse.Namespace, ops: list[str] | None) -> int:
    """``--sanitize TOOL``: each selected leaf is run in its own process under NVIDIA's
    compute-sanitizer (memcheck, racecheck, initcheck, synccheck); what the tool reports for that
    leaf's calls becomes a ``sanitizer`` outcome of the leaf (FAIL with the first findings), beside
    the leaf's own verdicts. Findings are per leaf: a sanitizer reports kernels and threads, not
    the suite's cases (replay a failing case with --case under the tool to narrow it)."""
    import shutil
    import subprocess
    import tempfile

    from qconform.properties.checks import Outcome
    from qconform.report import from_json

    tool = shutil.which(SANITIZER)
    if tool is None:
        raise UsageError(f"--sanitize: {SANITIZER} is not installed (it comes with the CUDA toolkit)")
    impl_spec = args.impl or "cupy"
    impl = load_impl(impl_spec, ops, args.contract)
    pairs = shard(_selected(impl, ops, args.leaf), args.shard)
    base = _drop_options(list(ARGV), ("--sanitize", "--workers", "--format", "--out", "--ops", "--leaf", "--shard"))
    base = [a for a in base if a != "--all-failures"]
    results: list[LeafResult] = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, (op, leaf) in enumerate(pairs):
            report, log = Path(tmp) / f"{k}.json", Path(tmp) / f"{k}.log"
            print(f"[{k + 1}/{len(pairs)}] {op.name} {leaf} under {SANITIZER} --tool {args.sanitize}", file=sys.stderr)
            cmd = [tool, "--tool", args.sanitize, "--log-file", str(log), "--print-limit", "20"]
            cmd += [sys.executable, "-m", "qconform", *base, "--ops", op.name, "--leaf", leaf, "--workers", "1"]
            cmd += ["--format", "json", "--out", str(report)]
            subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False)
            if not report.is_file():
                raise UsageError(f"--sanitize: the run of {op.name} {leaf} under {SANITIZER} wrote no report")
            (r,) = from_json(json.loads(report.read_text())) or [LeafResult(op.name, leaf, impl.arch, impl.name)]
            r.outcomes.append(Outcome("sanitizer", op.name, leaf, None, *sanitizer_findings(log, args.sanitize)))
            results.append(r)
    _emit_results(results, args, {"qconform": qconform.__version__, "sanitizer": f"{SANITIZER} --tool {args.sanitize}"})
    return _status(results)


def sanitizer_findings(log: Path, tool: str) -> tuple[bool, str]:
    """(ok, detail) from a compute-sanitizer log: its ERROR SUMMARY and the first findings."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    summary = re.search(r"ERROR SUMMARY: (\d+) error", text)
    if summary is None:
        return False, f"{SANITIZER} --tool {tool} printed no ERROR SUMMARY (did the run start?)"
    n = int(summary.group(1))
    if n == 0:
        return True, f"{SANITIZER} --tool {tool}: 0 errors"
    lines = [ln.strip("= ").strip() for ln in text.splitlines() if ln.startswith("=========")]
    findings = [ln for ln in lines if ln and not ln.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY"))]
    return False, f"{SANITIZER} --tool {tool}: {n} errors: " + " | ".join(findings[:6])


def _emit_results(results: list[LeafResult], args: argparse.Namespace, context: dict[str, Any]) -> None:
    """The table of results gathered from several runs (workers, sanitizer runs, merged reports):
    in catalogue order, the implementations they name in the context line."""
    results.sort(key=_catalogue_order)
    context = {
        **context,
        "impl": ", ".join(sorted({r.impl for r in results})),
        "contract": ", ".join(sorted({r.contract for r in results})),
    }
    max_failures = None if getattr(args, "all_failures", False) else getattr(args, "max_failures", MAX_FAILURES_SHOWN)
    _emit(render(results, args.format, context, max_failures), args.out)


def _status(results: list[LeafResult]) -> int:
    return EXIT_FAIL if any(r.verdict == "FAIL" for r in results) else EXIT_OK


def _catalogue_order(r: LeafResult) -> tuple[int, int]:
    names = list(CATALOGUE)
    if r.op not in CATALOGUE:
        return len(names), 0
    leaves = [lf.name for lf in CATALOGUE[r.op].leaves]
    return names.index(r.op), leaves.index(r.leaf) if r.leaf in leaves else len(leaves)


def _drop_options(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """``argv`` without the given options and their values (``--name value`` or ``--name=value``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in names:
            skip = True
            continue
        if a.split("=", 1)[0] in names:
            continue
        out.append(a)
    return out


def _hip() -> bool:
    import cupy

    return bool(cupy.cuda.runtime.is_hip)


OVERHEAD = 6  # peak memory per input byte while a case runs (measured: 1.6 GB for the 257 MiB lm_head case)


def coverage_3_plan(groups: list[Any]) -> None:
    """Before a coverage-3 run: its size, its largest case (by its inputs' bytes, among the cases
    coverage 3 adds), and whether that fits this machine's memory (one leaf's cases are held at a
    time, so the largest case is what bounds the run)."""
    n = sum(len(p) for _, _, p in groups)
    largest, where = 0, ""
    for op, leaf, lazy in groups:
        smaller = {c.id for c in op.cases(leaf, 2)}
        for case in [c for c in getattr(lazy, "cases", []) if c.id not in smaller]:
            size = sum(a.nbytes for a in op.make_inputs(case).values())
            if size > largest:
                largest, where = size, f"{op.name} {leaf} case {case.id}"
    need = largest * OVERHEAD
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    print(
        f"coverage 3: {n} cases over {len(groups)} leaves; the largest, {where}, holds {largest / 2**20:.0f} MiB of "
        f"inputs (about {need / 2**30:.1f} GiB while it runs; this machine has {total / 2**30:.0f} GiB)",
        file=sys.stderr,
        flush=True,
    )
    if total and need > total:
        raise UsageError(f"coverage 3 needs about {need / 2**30:.1f} GiB for {where}: run it on a larger machine")


def _stdout_write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def shard(groups: list[Any], spec: str | None) -> list[Any]:
    """``--shard i/n``: the leaves whose (op, leaf) hash falls to shard i of n (1-based): a
    deterministic split any CI matrix can spread over runners, every leaf in exactly one shard."""
    if spec is None:
        return groups
    i, n = parse_shard(spec)
    return [g for g in groups if zlib.crc32(f"{g[0].name}/{g[1]}".encode()) % n == i - 1]


def parse_shard(spec: str) -> tuple[int, int]:
    """``"i/n"`` (1-based, 1 <= i <= n) as (i, n), or UsageError: every ``--shard`` option's rule."""
    i, sep, n = spec.partition("/")
    if not sep or not i.isdigit() or not n.isdigit() or not 1 <= int(i) <= int(n):
        raise UsageError(f"--shard: must be i/n with 1 <= i <= n, got {spec!r}")
    return int(i), int(n)


def _device_line() -> str:
    from qconform.device.loader import device_info

    info = device_info()
    return f"{info.name} ({info.arch}, warp {info.warp_size}, L2 {info.l2_bytes >> 20} MiB; {info.runtime})"


def cmd_fuzz(args: argparse.Namespace) -> int:
    from qconform.fuzz import fuzz

    op = get_op(args.op)
    leaves = [lf.name for lf in op.leaves]
    if args.leaf is not None and args.leaf not in leaves:
        raise UsageError(f"--leaf: {op.name} has no leaf {args.leaf!r}; leaves: {', '.join(leaves)}")
    impl = _isolated(load_impl(args.impl, [op.name], args.contract), args, [op.name])
    status = EXIT_OK
    for leaf in [args.leaf] if args.leaf else leaves:
        status = max(status, fuzz(impl, op, leaf, examples=args.examples, seed=args.seed, save_dir=Path(args.save)))
    return status


def cmd_golden(args: argparse.Namespace) -> int:
    from qconform.golden import verify_set, write_set

    if args.golden_cmd == "generate":
        ops = _op_names(args.ops)
        pairs = _selected(OracleImpl(), ops, None)
        unknown = set(args.leaf or ()) - {leaf for _, leaf in pairs}
        if unknown:
            raise UsageError(f"--leaf: no leaf {', '.join(sorted(unknown))} in the selected ops")
        leaves = [
            (op, leaf, [Prepared.from_case(op, c) for c in op.cases(leaf, args.coverage)])
            for op, leaf in pairs
            if not args.leaf or leaf in args.leaf
        ]
        out = Path(args.out)
        if (out / "MANIFEST.json").exists() and not args.force:
            raise UsageError(f"{out} already holds a golden set; pass --force to overwrite it")
        command = f"qconform golden generate --out {args.out} --coverage {args.coverage}"
        command += "".join(f" --ops {o}" for o in ops or []) + "".join(f" --leaf {lf}" for lf in args.leaf or [])
        manifest = write_set(out, leaves, coverage=args.coverage, command=command)
        total = sum(f["bytes"] for f in manifest["files"])
        ncases = sum(len(f["cases"]) for f in manifest["files"])
        print(f"wrote {len(manifest['files'])} files, {ncases} cases, {total} bytes to {out}")
        return EXIT_OK
    set_dir = Path(args.dir)
    if not (set_dir / "MANIFEST.json").is_file():
        raise UsageError(f"{set_dir} has no MANIFEST.json")
    impl = load_impl(args.impl or "oracle", contract=args.contract)
    try:
        report = verify_set(set_dir, impl)
    except (ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, ArgumentError):
            raise
        raise UsageError(f"{set_dir}/MANIFEST.json is unreadable ({type(exc).__name__}: {exc})") from exc
    if report.oracle_sources_changed:
        print("note: the oracle sources changed since this set was generated")
    for f in report.findings:
        print(f"{f.kind.upper()} {f.path}: {f.detail}")
    verdict = "OK" if report.ok else "FAILED"
    print(
        f"golden verify {set_dir}: {report.files} files, {report.cases} cases replayed with {report.impl} "
        f"(contract {report.contract}), "
        f"{len(report.findings)} problems: {verdict}"
    )
    return EXIT_OK if report.ok else EXIT_FAIL


def cmd_list(args: argparse.Namespace) -> int:
    if args.families:
        print(" ".join(dict.fromkeys(op.family for op in CATALOGUE.values())))
        return EXIT_OK
    if args.names:
        if args.family is not None and all(op.family != args.family for op in CATALOGUE.values()):
            raise UsageError(f"--family: no op of family {args.family!r}")
        with_kernels = {k.op for k in KERNELS}
        chosen = [
            op.name
            for op in CATALOGUE.values()
            if args.family in (None, op.family) and (not args.with_kernels or op.name in with_kernels)
        ]
        print(",".join(chosen))  # empty with --with-kernels when the family has no kernel of ours yet
        return EXIT_OK
    print("Ops:")
    for op in CATALOGUE.values():
        for lf in op.leaves:
            counts = "/".join(str(len(op.cases(lf.name, c))) for c in (1, 2, 3))
            print(f"  {op.name:14} {lf.name:14} family={op.family} check={op.check.kind} cases(cov1/2/3)={counts}")
    print("Implementations:")
    for name in BUILTIN_IMPLS:
        print(f"  {name}")
    print("  py:module:callable  a drop-in for an op's oracle function (see README)")
    found, why = device_available()
    print(f"Device implementations ({'device found' if found else f'unavailable here: {why}'}):")
    for name in DEVICE_IMPLS:
        print(f"  {name}")
    print("Device kernels (a user's kernel's ABI: qconform abi OP):")
    for k in KERNELS:
        g = f"lanes={k.geometry.lanes:<3} threads={k.geometry.threads:<4}" if k.geometry else "(its launcher)"
        print(f"  {k.op:22} {k.variant:5} {k.symbol:28} {k.source:30} {g} {k.doc}")
    return EXIT_OK


def abi_text(op: OpSpec) -> str:
    """``qconform abi OP``: the C prototypes, the argument table, enums, geometry and status rules."""
    from qconform.ops import abi as A

    a = op.abi
    lines = [
        f"{op.name}: {a.summary}",
        "",
        f"C ({A.HEADER_NAME} declares the list as {A.macro_name(op.name)}; enum codes as QCONFORM_<ENUM>_<LABEL>):",
        "",
        A.prototypes(op.name, a),
        "",
    ]
    rows = [("#", "argument", "C type", "dtype / shape", "meaning")]
    rows += [(str(i), *row) for i, row in enumerate(A.table(a))]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows]
    for e in a.enums:
        lines += ["", f"enum {e.name}:"]
        lines += [f"  {e.macro(label)} = {value}" + (f"  {doc}" if doc else "") for label, value, doc in e.codes]
    lines += [
        "",
        f"launch (hip:): {A.geometry_line(a)}; override with :lanes=N :threads=N :grid=N :smem=BYTES",
        "status (so:): 0 success (the status of its own launch, never a pending error it did not cause); "
        f"QCONFORM_STATUS_DECLINED = {A.STATUS_DECLINED} for a case it does not handle (counted as declined); "
        "non-zero for invalid sizes (the suite calls it with a size of -1)",
        "declining in hip:: :requires=EXPR over the scalar arguments above (e.g. :requires=bits==2)",
        *(f"note: {n}" for n in a.notes),
        "leaves: " + ", ".join(f"{lf.name} {lf.params}" for lf in op.leaves),
    ]
    return "\n".join(lines) + "\n"


def cmd_abi(args: argparse.Namespace) -> int:
    from qconform.ops.abi import header, macro_name

    if args.header is not None:
        text = header(CATALOGUE)
        if args.header == "-":
            sys.stdout.write(text)
        else:
            _emit(text, args.header)
        return EXIT_OK
    if args.op:
        sys.stdout.write(abi_text(get_op(args.op)))
        return EXIT_OK
    for op in CATALOGUE.values():
        print(f"{op.name:24} {macro_name(op.name):40} {op.abi.summary}")
    print("qconform abi OP: its prototype and argument table; qconform abi --header: the C header")
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    """``qconform report merge``: one table from JSON reports (shards, runners, architectures)."""
    from qconform.report import from_json

    results: list[LeafResult] = []
    for name in args.files:
        try:
            data = json.loads(Path(name).read_text())
            results += from_json(data)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"{name}: not a qconform JSON report ({type(exc).__name__}: {exc})") from exc
    _check_out_path(args.out)
    _emit_results(results, args, {"merged": f"{len(args.files)} reports"})
    return _status(results)


def cmd_bench(args: argparse.Namespace) -> int:
    """With a GPU: qconform's device kernels against their baselines (the MatMulNBits decode table
    of ``qconform.bench.nbits``); without one: the CPU oracle's throughput against gguf-py and
    ggml's C (``qconform.bench.ggml_quant``: Q4_K/Q6_K dequantize, Q8_0/Q4_0 quantize). Printed
    lines and a JSON record per (kernel, shape); ``--compare`` prints the change against an
    earlier record file."""
    from qconform.bench.ggml_quant import bench_ggml
    from qconform.bench.records import compare, plot, read_records, write_records

    old = None
    if args.compare:
        try:
            old = read_records(Path(args.compare))
        except (OSError, ValueError, KeyError) as exc:
            raise UsageError(f"--compare: cannot read {args.compare}: {exc}") from exc
    _check_out_path(args.json, "--json")
    _check_out_path(args.plot, "--plot")
    found, why = device_available()
    if args.where == "gpu" and not found:
        raise UsageError(f"--where gpu: no GPU device found ({why})")
    if found and args.where != "cpu":
        from qconform.bench.nbits import run_all

        print(f"GPU ({why}): qconform's MatMulNBits decode kernels against their baselines", flush=True)
        records = run_all(quick=args.quick)
    else:
        print(f"CPU ({'--where cpu' if found else why}): the ggml oracle against gguf-py and ggml's C", flush=True)
        records = bench_ggml(mb=args.mb, repeats=args.repeats)["records"]
    if args.json:
        write_records(Path(args.json), records)
        print(f"wrote {len(records)} record(s) to {args.json}")
    if old is not None:
        print("\n".join(compare(old, records)))
    if args.plot:
        try:
            plot(records, Path(args.plot))
        except RuntimeError as exc:
            raise UsageError(str(exc)) from exc
        print(f"wrote {args.plot}")
    return EXIT_OK


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (``qconform: error: ...``) and exit 2; subcommands alike."""

    def error(self, message: str) -> Any:  # argparse's signature: it never returns
        where = self.prog.removeprefix("qconform").strip()
        self.exit(EXIT_USAGE, f"qconform: error: {where + ': ' if where else ''}{message} ({self.prog} --help)\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help with its default, where it has one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, argparse.SUPPRESS) or not action.help:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    fmt = _HelpFormatter
    p = _Parser(prog="qconform", description=__doc__, formatter_class=fmt)
    p.add_argument("--version", action="version", version=f"qconform {qconform.__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser(
        "run",
        help="run the conformance suite and print the table",
        description="Run every property of the selected ops and leaves; rows print as each leaf finishes. "
        "Exit status: 0 all passed, 1 a failure, 2 a usage or environment error (or nothing ran), "
        "130 interrupted (the partial table is printed).",
        formatter_class=fmt,
    )
    r.add_argument(
        "--impl",
        help="oracle | oracle-numpy | py:module:callable | cupy[:coop|:ref] | hip:file.hip:symbol[:lanes=N]"
        "[:threads=N][:grid=N][:smem=N][:opt=FLAG][:requires=EXPR] | so:lib.so:symbol[:requires=EXPR] "
        "(the op's ABI: qconform abi OP; default: cupy if a GPU is found, else the oracle against the golden set)",
    )
    r.add_argument("--ops", action="append", help="ops to run (comma-separated or repeated; default: all it covers)")
    r.add_argument("--leaf", help="only this leaf (default: every leaf)")
    r.add_argument("--coverage", type=int, choices=(1, 2, 3), default=2, help="1 quick, 2 CI, 3 full LLM shapes")
    r.add_argument("--golden", help="run the cases of this golden set instead of generated ones")
    r.add_argument(
        "--case", help="replay one case: its JSON (as a failure's replay line prints it) or its id (with --ops/--leaf)"
    )
    r.add_argument(
        "--repeat-calls", type=_positive, default=DEFAULT_REPEAT_CALLS, help="calls of the repeatability property"
    )
    r.add_argument(
        "--no-cold", action="store_true", help="on a device, skip the extra input sets larger than the L2 cache"
    )
    r.add_argument("--format", choices=tuple(RENDERERS), default="text", help="report format")
    r.add_argument("--out", help="write the report to this file (its folder must exist)")
    r.add_argument("--max-failures", type=_positive, default=MAX_FAILURES_SHOWN, help="failure lines shown per leaf")
    r.add_argument("--all-failures", action="store_true", help="show every failure line")
    r.add_argument("--shard", metavar="I/N", help="run only shard I of N (a deterministic split by op and leaf)")
    r.add_argument(
        "--sanitize",
        choices=("memcheck", "racecheck", "initcheck", "synccheck"),
        help="run each leaf under NVIDIA compute-sanitizer with this tool and report its findings per leaf",
    )
    r.add_argument(
        "--workers",
        default="auto",
        help="run the leaves in N worker processes (shards, one table; on a device run worker i uses GPU i mod the "
        "GPUs seen); auto: one per visible GPU on a device run, else 1",
    )
    _isolation_options(r)
    _contract_option(r)
    r.set_defaults(fn=cmd_run)

    f = sub.add_parser(
        "fuzz", help="search for an input where an implementation differs from the oracle", formatter_class=fmt
    )
    f.add_argument("--op", required=True, help="the op to fuzz")
    f.add_argument("--leaf", help="the leaf (default: every leaf of the op, one after the other)")
    f.add_argument("--impl", default="oracle", help="the implementation (as qconform run --impl)")
    f.add_argument("--examples", type=_positive, default=500, help="hypothesis examples per leaf")
    f.add_argument("--seed", type=int, default=0, help="hypothesis seed")
    f.add_argument("--save", default="fuzz-failures", help="directory for the failing case's golden set")
    _isolation_options(f)
    _contract_option(f)
    f.set_defaults(fn=cmd_fuzz)

    g = sub.add_parser("golden", help="generate or verify golden vectors", formatter_class=fmt)
    gsub = g.add_subparsers(dest="golden_cmd", required=True)
    gg = gsub.add_parser("generate", help="write a golden set from the oracle", formatter_class=fmt)
    gg.add_argument("--out", required=True, help="the set's directory")
    gg.add_argument("--ops", action="append", help="ops to include (default: every op)")
    gg.add_argument("--leaf", action="append", help="only these leaves of those ops (repeated; default: every leaf)")
    gg.add_argument("--coverage", type=int, choices=(1, 2, 3), default=1, help="which cases")
    gg.add_argument("--force", action="store_true", help="overwrite an existing set")
    gv = gsub.add_parser(
        "verify", help="check a set's checksums, then replay it with an implementation", formatter_class=fmt
    )
    gv.add_argument("dir", help="the set's directory (holds MANIFEST.json)")
    gv.add_argument("--impl", help="the implementation to replay with (default: the oracle)")
    _contract_option(gv)
    g.set_defaults(fn=cmd_golden)

    b = sub.add_parser(
        "bench", help="device kernels against their baselines (a GPU), else oracle throughput", formatter_class=fmt
    )
    b.add_argument("--where", choices=("auto", "gpu", "cpu"), default="auto", help="the benchmarks to run")
    b.add_argument("--quick", action="store_true", help="device: the first layer shape at M = 1 only")
    b.add_argument("--mb", type=_positive, default=128, help="CPU: float32 input size in MiB")
    b.add_argument("--repeats", type=_positive, default=5, help="CPU: timed runs of each side (min/median/max printed)")
    b.add_argument("--json", help="write one JSON record per (kernel, shape) to this file")
    b.add_argument("--compare", metavar="OLD.json", help="print each record's change against this record file")
    b.add_argument("--plot", metavar="FILE.png", help="draw the records as a roofline (needs matplotlib)")
    b.set_defaults(fn=cmd_bench)

    rp = sub.add_parser("report", help="join JSON reports (shards, runners, architectures)", formatter_class=fmt)
    rsub = rp.add_subparsers(dest="report_cmd", required=True)
    rm = rsub.add_parser("merge", help="one table from several `qconform run --format json` files", formatter_class=fmt)
    rm.add_argument("files", nargs="+", help="JSON report files")
    rm.add_argument("--format", choices=tuple(RENDERERS), default="text", help="report format")
    rm.add_argument("--out", help="write the merged report to this file")
    rp.set_defaults(fn=cmd_report)

    ls = sub.add_parser("list", help="ops, leaves and implementations", formatter_class=fmt)
    ls.add_argument("--names", action="store_true", help="only the op names, comma-separated (for scripts)")
    ls.add_argument("--family", help="with --names: only this family's ops")
    ls.add_argument("--families", action="store_true", help="only the family names, space-separated")
    ls.add_argument("--with-kernels", action="store_true", help="with --names: only ops with device kernels")
    ls.set_defaults(fn=cmd_list)

    a = sub.add_parser(
        "abi", help="an op's device ABI for hip: kernels and so: launchers (prototype, arguments)", formatter_class=fmt
    )
    a.add_argument("op", nargs="?", help="the op (default: list every op's ABI macro)")
    a.add_argument(
        "--header",
        nargs="?",
        const="-",
        metavar="FILE",
        help="print (or write to FILE) the generated C header qconform_abi.h with every op's declarations",
    )
    a.set_defaults(fn=cmd_abi)
    return p


def _isolation_options(parser: argparse.ArgumentParser) -> None:
    from qconform.impls.worker import DEFAULT_TIMEOUT_S

    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds one call of a py: drop-in may take (it runs in a worker process; a hang or a crash fails "
        "that case and the run goes on in a fresh worker, whose start-up is not counted)",
    )
    parser.add_argument("--in-process", action="store_true", help="call a py: drop-in in this process (debugging)")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


ARGV: list[str] = []  # the command line being run (workers rerun it with their shard)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ARGV[:] = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code not in (0, None) else EXIT_OK
    try:
        return args.fn(args)
    except (UsageError, ArgumentError) as exc:
        print(f"qconform: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
