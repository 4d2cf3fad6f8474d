"""The QMoE decode path's tiling (``qconform.device.qmoe_tiling``): functions of the shape that fit
the kernels' limits (``kernels/ort/qmoe.hip``), and the bench layers' tilings as docs/perf-notes.md
states them. Offline (no CuPy)."""

from __future__ import annotations

import numpy as np
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
    fc2m_parts,
    fc2m_staged_bytes,
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


def _serial_fc2m(k: int, K: int, parts: int) -> int:
    """qk_moe_fc2m's steps one after the other in a CTA of 8 warps taking its k x parts (slot, part)
    pairs in rounds: each round a part's steps plus one for the first loads (the rule's model)."""
    steps = -(-K // 256)
    return -(-k * parts // 8) * (-(-steps // parts) + 1)


FC2M_CELLS = [(k, K) for k in (1, 2, 4, 6, 8, 16, 32) for K in (32, 256, 512, 768, 1024, 1536, 2880)]
FC2M_MUTANTS = {
    "always 1 part": lambda k, K: 1,
    "ties to more parts": lambda k, K: min((1, 2, 4), key=lambda p: (_serial_fc2m(k, K, p), -p)),
    "8 parts (past s_dot's k x 4 rows)": lambda k, K: min((1, 2, 4, 8), key=lambda p: (_serial_fc2m(k, K, p), p)),
}


def _fc2m_rule_holds(rule, k: int, K: int) -> bool:
    """``rule(k, K)`` is 1, 2 or 4 (s_dot holds k x 4 pairs; a warp's pairs warp + 8 i keep one part), the
    fewest serial steps, ties to fewer parts."""
    parts = rule(k, K)
    if parts not in (1, 2, 4):
        return False
    best = min(_serial_fc2m(k, K, p) for p in (1, 2, 4))
    return _serial_fc2m(k, K, parts) == best and all(_serial_fc2m(k, K, p) > best for p in (1, 2, 4) if p < parts)


@pytest.mark.parametrize("k, K", FC2M_CELLS)
def test_fc2m_parts_takes_the_fewest_serial_steps(k: int, K: int) -> None:
    assert _fc2m_rule_holds(fc2m_parts, k, K)
    if K <= 256:
        assert fc2m_parts(k, K) == 1


@pytest.mark.parametrize("name", FC2M_MUTANTS)
def test_fc2m_parts_mutants_caught(name: str) -> None:
    assert not all(_fc2m_rule_holds(FC2M_MUTANTS[name], k, K) for k, K in FC2M_CELLS), name


def test_fc2m_parts_of_the_bench_layer() -> None:
    # measured on the H200 (docs/perf-notes.md, session 20): gpt-oss-20b's fc2 (k 4, K 2880) 50.3 us at the
    # rule's 2 parts, 53.7 at 1, 50.7 at 4
    assert fc2m_parts(4, 2880) == 2


@pytest.mark.parametrize("k, K", [(1, 32), (4, 2880), (8, 768), (8, 1536), (3, 200 * 32)])
def test_fc2m_planes_fit_the_staged_bytes(k: int, K: int) -> None:
    # qk_moe_store_planes writes value u of slot j's plane q at halfword ((j 3 + q) words + u / 8) 8 +
    # 2 (u & 3) + ((u >> 2) & 1), words = 32 ceil(K / 256) 16-byte units; qk_moe_fc2m reads slot j's
    # planes from unit 3 j words, steps x 32 units each: every value lands once, inside the bytes staged
    words = 32 * -(-K // 256)
    u = np.arange(K)
    at = {
        int(((j * 3 + q) * words + v // 8) * 8 + 2 * (v & 3) + ((v >> 2) & 1))
        for j in range(k)
        for q in range(3)
        for v in u.tolist()
    }
    assert len(at) == 3 * k * K
    assert max(at) * 2 + 2 <= fc2m_staged_bytes(k, K)
    assert fc2m_staged_bytes(k, K) == 3 * k * words * 16
