"""Measure the device's approximate fp32 reciprocal (``rcp.approx.ftz.f32`` on NVIDIA, ``v_rcp_f32``
on AMD) as the int8 difference table of ``qconform.oracles.bnb.rcp`` and check the table's rule.

``python -m qconform.device.bnb.rcp [--out FILE]`` (``ci/device.sh check bnb`` runs it): builds
the table on the GPU (kernels ``bnb/rcp.hip``), prints its sha256 and whether it is the shipped
sm_90 table's (``RCP_TABLE_SHA256``), checks that the oracle's ``reciprocal(m, ftz, table)``
reproduces the device bit for bit on values of every exponent and the special values (the claim
that one table of mantissas scales exactly by 2^k), and writes the table (``.npz``, or raw int8
bytes) where asked. Exit 1 when the rule does not hold or a difference overflows int8.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import cupy
import numpy as np

from qconform.device.launchers import launch
from qconform.oracles.bnb.rcp import RCP_TABLE_SHA256, RCP_TABLE_SIZE, reciprocal

SOURCE = "bnb/rcp.hip"


@dataclass(frozen=True)
class RcpMeasurement:
    table: np.ndarray  # int8, RCP_TABLE_SIZE
    sha256: str
    overflow: bool  # a difference outside int8 (the table cannot describe the device)
    mismatches: int  # sampled values where the oracle with this table differs from the device
    sampled: int

    @property
    def is_shipped(self) -> bool:
        return self.sha256 == RCP_TABLE_SHA256


def measure_table() -> tuple[np.ndarray, bool]:
    """The device's difference table over the 2^23 mantissas of [1, 2), and whether any overflowed."""
    table = cupy.empty(RCP_TABLE_SIZE, cupy.int8)
    overflow = cupy.zeros(1, cupy.int32)
    launch("rcp_table", SOURCE, "qk_rcp_table", RCP_TABLE_SIZE, (table, np.int64(RCP_TABLE_SIZE), overflow))
    return cupy.asnumpy(table), bool(int(overflow.get()[0]))


def device_reciprocal(x: np.ndarray) -> np.ndarray:
    """The device's approximate reciprocal of every float32 in ``x``."""
    xd = cupy.asarray(np.ascontiguousarray(x, np.float32))
    y = cupy.empty(xd.shape, cupy.uint32)
    launch("rcp_scaled", SOURCE, "qk_rcp_scaled", xd.size, (xd, y, np.int64(xd.size)))
    return cupy.asnumpy(y).view(np.float32)


def probe_values(seed: int = 0, per_exponent: int = 4096) -> np.ndarray:
    """Random mantissas at every biased exponent 0..255 (subnormals, normals, inf / NaN), the
    mantissas at the edges of [1, 2), and the special values."""
    rng = np.random.default_rng(seed)
    mant = rng.integers(0, 1 << 23, size=(256, per_exponent), dtype=np.uint32)
    mant[:, :4] = [0, 1, (1 << 23) - 2, (1 << 23) - 1]
    exp = np.arange(256, dtype=np.uint32)[:, None] << np.uint32(23)
    bits = (exp | mant).ravel()
    bits = np.concatenate([bits, bits | np.uint32(0x80000000)])
    return bits.view(np.float32)


def measure(seed: int = 0) -> RcpMeasurement:
    table, overflow = measure_table()
    x = probe_values(seed)
    got = device_reciprocal(x).view(np.uint32)
    want = reciprocal(x, True, table).view(np.uint32)
    nan = np.isnan(x)  # NaN in, NaN out: the payload is the device's own
    bad = (got != want) & ~nan
    bad |= nan & ~np.isnan(got.view(np.float32))
    return RcpMeasurement(table, hashlib.sha256(table.tobytes()).hexdigest(), overflow, int(bad.sum()), x.size)


def write_table(table: np.ndarray, path: Path) -> None:
    if path.suffix == ".npz":
        np.savez_compressed(path, rcp_table=table)
    else:
        table.tofile(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qconform.device.bnb.rcp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the table here (.npz compressed, else raw int8 bytes)")
    args = parser.parse_args(argv)
    m = measure()
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    plus, minus = int((m.table > 0).sum()), int((m.table < 0).sum())
    print(f"device: {name}")
    shipped = "the shipped sm_90 table" if m.is_shipped else "NOT the shipped sm_90 table"
    print(f"rcp table sha256 {m.sha256} ({shipped})")
    worst = int(np.abs(m.table.astype(np.int32)).max())
    print(f"mantissas off the IEEE reciprocal: {plus} above, {minus} below, max |bits difference| {worst}")
    print(f"oracle with this table vs the device: {m.mismatches} of {m.sampled} sampled values differ")
    if args.out:
        write_table(m.table, args.out)
        print(f"written: {args.out}")
    return 1 if m.overflow or m.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
