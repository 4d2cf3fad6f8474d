"""The QMoE decode path's tiling (``qconform.device.qmoe_tiling``): functions of the shape that fit
the kernels' limits (``kernels/ort/qmoe.hip``), and the bench layers' tilings as docs/perf-notes.md
states them. Offline (no CuPy)."""

from __future__ import annotations

import pytest

from qconform.device.qmoe_tiling import (
    CTAS_PER_SM,
    GROUP,
    REF_WARPS,
    ROWS,
    THREADS,
    XMAX,
    YMAX,
    chunk_words,
    fc1_ctas,
    fc2_tile,
    lanes_over,
    mma_parts,
    staged_bytes,
)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 24, 31, 32, 33, 64, 90, 96, 360, 1000])
def test_lanes_are_a_power_of_two_leaving_at_most_an_eighth_idle(n: int) -> None:
    lanes = lanes_over(n)
    assert 1 <= lanes <= GROUP and lanes & (lanes - 1) == 0
    assert (-(-n // lanes) * lanes - n) * 8 <= n or lanes == 1
    if lanes < GROUP:  # the next wider one would idle more
        wider = 2 * lanes
        assert (-(-n // wider) * wider - n) * 8 > n


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("K", [16, 32, 96, 176, 768, 2880])
@pytest.mark.parametrize("bs", [0, 32, 64, 128])
def test_a_chunk_divides_the_row_and_the_block(bits: int, K: int, bs: int) -> None:
    if K * bits % 32 or (bs and K % bs):
        return
    vw = chunk_words(K, bits, bs)
    words = K * bits // 32
    assert vw in (1, 2, 4) and words % vw == 0
    assert not bs or (bs * bits // 32) % vw == 0


@pytest.mark.parametrize("N, tokens, k, lanes", [(2880, 1, 4, 32), (2048, 1, 8, 8), (32, 64, 8, 1), (384, 32, 32, 4)])
def test_fc2_tile_fits_shared_memory(N: int, tokens: int, k: int, lanes: int) -> None:
    tile = fc2_tile(N, tokens, k, lanes)
    assert tile % ROWS == 0 and 4 <= tile <= 64 and k * tile <= YMAX
    assert THREADS % GROUP == 0


def test_bench_layers_tiling() -> None:
    # gpt-oss-20b: K 2880 u4 block 32 -> 90 chunks of 16 bytes on 32 lanes; fc2 tile 16 (180 CTAs)
    assert chunk_words(2880, 4, 32) == 4 and lanes_over(90) == 32 and fc2_tile(2880, 1, 4, 32) == 16
    # Qwen3-30B-A3B: fc1 K 2048 -> 64 chunks, 32 lanes; fc2 K 768 -> 24 chunks, 8 lanes, tile 16
    assert chunk_words(2048, 4, 128) == 4 and lanes_over(64) == 32
    assert chunk_words(768, 4, 128) == 4 and lanes_over(24) == 8 and fc2_tile(2048, 1, 8, 8) == 16
    # qk_moe_fc1v's grid on 132 SMs: gpt-oss 5760 tasks in 3 rounds of 240 CTAs, Qwen 3072 in 2 of 192
    assert fc1_ctas(4 * 1440, 8, 1, 132) == 240 and fc1_ctas(8 * 384, 8, 1, 132) == 192


@pytest.mark.parametrize("K", [4, 8, 28, 36, 768, 2048, 2880, XMAX])
def test_staged_row_holds_the_swizzled_units(K: int) -> None:
    # qk_moe_swz(u) = u ^ ((u >> 3) & 7) keeps u inside its group of 8 units: every slot < the groups
    units = K // 4
    slots = {u ^ ((u >> 3) & 7) for u in range(units)}
    assert len(slots) == units and max(slots) < staged_bytes(K) // 16
    assert staged_bytes(K) <= 32768  # + the routing's 2.3 KB static: under 48 KB on every target


@pytest.mark.parametrize(
    "tasks, places, tokens, sms", [(5760, 8, 1, 132), (3072, 8, 1, 132), (7, 64, 3, 4), (100000, 8, 60, 132)]
)
def test_fc1_ctas_take_every_task_in_the_fewest_rounds(tasks: int, places: int, tokens: int, sms: int) -> None:
    ctas = fc1_ctas(tasks, places, tokens, sms)
    resident = max(1, CTAS_PER_SM * sms // tokens)
    rounds = -(-tasks // (places * ctas))
    assert 1 <= ctas <= resident
    assert rounds == -(-tasks // (places * min(resident, -(-tasks // places))))
    assert (ctas - 1) * places * rounds < tasks  # no CTA without a task


def _serial(tasks: int, K: int, parts: int) -> int:
    """qk_moe_fc1m's steps one after the other with ``parts`` warps a task, REF_WARPS at a time: the
    rounds, each a part's steps plus one for the first loads (the rule's model, restated)."""
    steps = -(-K // 256)
    return -(-tasks * parts // REF_WARPS) * (-(-steps // parts) + 1)


@pytest.mark.parametrize("tasks", [1, 8, 96, 768, 1440, 2112, 5000, 100000])
@pytest.mark.parametrize("K", [32, 256, 512, 768, 2048, 2880, XMAX])
def test_mma_parts_takes_the_fewest_serial_steps(tasks: int, K: int) -> None:
    parts = mma_parts(tasks, K)
    assert parts in (1, 2, 4, 8)
    best = min(_serial(tasks, K, p) for p in (1, 2, 4, 8))
    assert _serial(tasks, K, parts) == best
    assert all(_serial(tasks, K, p) > best for p in (1, 2, 4, 8) if p < parts)  # ties: fewer parts
    if K <= 256:  # one step: nothing to split
        assert parts == 1


def test_mma_parts_of_the_bench_layers() -> None:
    # measured on the H200 (docs/perf-notes.md, session 18): gpt-oss-20b's fc1 (1440 tasks of 16 rows, 12
    # steps) fastest at 4 parts, Qwen3-30B-A3B's (768 tasks, 8 steps) at 2; the rule picks those
    assert mma_parts(4 * 5760 // 16, 2880) == 4 and mma_parts(8 * 1536 // 16, 2048) == 2
