"""Benchmark records: one JSON record per (kernel, shape), so a change shows its speed diff.

A record holds the bytes and flops of one call, every timed run (microseconds; min / median /
max are its spread), the baselines timed beside it in the same run (their medians and the ratio
baseline / kernel), the verdict of the same kernel on the same input, and the machine. ``compare``
prints the change per record and says when it is inside the spread of either run.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = 1
STREAM_ORDER = "stream_order"
"""The benches' variant name for the shipped build timed with every launch in stream order: the
control beside the programmatic dependent launches (qconform.device.pdl)."""


@dataclass(frozen=True)
class BenchRecord:
    kernel: str
    shape: tuple[int, ...]
    device: str
    bytes: int
    flops: int
    times_us: tuple[float, ...]
    verdict: str  # PASS / FAIL of the same kernel on the same input
    baselines: dict[str, float] = field(default_factory=dict)  # name -> median us, timed in the same run

    @property
    def key(self) -> str:
        return f"{self.kernel} {'x'.join(str(d) for d in self.shape)}"

    @property
    def median_us(self) -> float:
        return statistics.median(self.times_us)

    @property
    def spread(self) -> tuple[float, float, float]:
        return min(self.times_us), self.median_us, max(self.times_us)

    def ratios(self) -> dict[str, float]:
        """baseline median / kernel median: above 1 the kernel is faster."""
        return {name: us / self.median_us for name, us in self.baselines.items()}

    def to_dict(self) -> dict[str, Any]:
        lo, med, hi = self.spread
        gbps = self.bytes / (med * 1e-6) / 1e9 if med > 0 else 0.0
        extra = {"min_us": lo, "median_us": med, "max_us": hi, "GBps": gbps, "ratios": self.ratios()}
        return {**asdict(self), "shape": list(self.shape), "times_us": list(self.times_us), **extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BenchRecord":
        return cls(
            d["kernel"],
            tuple(d["shape"]),
            d["device"],
            int(d["bytes"]),
            int(d["flops"]),
            tuple(float(t) for t in d["times_us"]),
            d["verdict"],
            {k: float(v) for k, v in d.get("baselines", {}).items()},
        )


def write_records(path: Path, records: list[BenchRecord]) -> None:
    path.write_text(json.dumps({"schema": SCHEMA, "records": [r.to_dict() for r in records]}, indent=1) + "\n")


def bench_parser(module: str, quick: str) -> argparse.ArgumentParser:
    """The command line every device bench takes: ``--quick`` (what it leaves out: ``quick``) and
    ``--json`` (where to write its records)."""
    p = argparse.ArgumentParser(prog=f"python -m qconform.bench.{module}")
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--json", type=Path, help="write the BenchRecords here")
    return p


def finish(records: list[BenchRecord], json_path: Path | None, passing: tuple[str, ...] = ("PASS",)) -> int:
    """Write the records where asked; the exit status: 0 when every verdict is in ``passing``."""
    if json_path:
        write_records(json_path, records)
    return 0 if all(r.verdict in passing for r in records) else 1


def read_records(path: Path) -> list[BenchRecord]:
    data = json.loads(path.read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a qconform bench record file (schema {data.get('schema')!r})")
    return [BenchRecord.from_dict(d) for d in data["records"]]


def compare(old: list[BenchRecord], new: list[BenchRecord]) -> list[str]:
    """A line per record of ``new``: its median against the old one's, the change, and whether
    the two runs' min..max ranges overlap (then the change is not claimed)."""
    before = {r.key: r for r in old}
    lines = []
    for r in new:
        o = before.get(r.key)
        if o is None:
            lines.append(f"{r.key}: {r.median_us:.1f} us (new)")
            continue
        change = (r.median_us / o.median_us - 1) * 100
        overlap = min(r.times_us) <= max(o.times_us) and min(o.times_us) <= max(r.times_us)
        note = "within the spread" if overlap else ("faster" if change < 0 else "slower")
        verdict = "" if r.verdict == o.verdict else f", verdict {o.verdict} -> {r.verdict}"
        lines.append(f"{r.key}: {o.median_us:.1f} -> {r.median_us:.1f} us ({change:+.1f}%, {note}{verdict})")
    lines += [f"{k}: gone (was {o.median_us:.1f} us)" for k, o in before.items() if k not in {r.key for r in new}]
    return lines


def plot(records: list[BenchRecord], path: Path, peak_gbps: float | None = None) -> None:
    """A roofline: GB/s per record against its arithmetic intensity (flops / byte), the machine's
    peak bandwidth as a line when given. Needs matplotlib (``pip install 'qconform[plot]'``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib: pip install 'qconform[plot]'") from exc
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in records:
        d = r.to_dict()
        ax.scatter(max(r.flops, 1) / r.bytes, d["GBps"], label=r.key)
    if peak_gbps:
        ax.axhline(peak_gbps, linestyle="--", color="grey", label=f"copy bandwidth {peak_gbps:.0f} GB/s")
    ax.set_xscale("log")
    ax.set_xlabel("flops / byte")
    ax.set_ylabel("GB/s (median)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
