"""The decode path's tiling of the QMoE kernels (``kernels/ort/qmoe.hip``, launcher
``qconform.device.ort.qmoe``): functions of the shape alone, so every call of a shape adds in one
order. No CuPy here (offline tests model the kernels' order with these)."""

from __future__ import annotations

THREADS = 256  # threads per CTA: 8 groups of 32 lanes (wave32 and wave64 alike)
GROUP = 32  # lanes of a reduction group (QK_MOE_GROUP)
EMAX, KMAX, ROWS, YMAX, GRID_Y = 512, 32, 4, 2048, 65535  # qmoe.hip's QK_MOE_EMAX, _KMAX, _ROWS, _YMAX; grid.y
XMAX = 8192  # hidden sizes whose fp32 input row qk_moe_fc1v stages in shared memory (32 KB)
CTAS_PER_SM = 2  # qk_moe_fc1v's and qk_moe_fc1m's __launch_bounds__(256, 2)


def lanes_over(n: int) -> int:
    """Lanes per task of the decode path over n chunks (or blocks): the largest power of two <= 32
    whose last round leaves at most an eighth of n's worth of lanes idle (90 chunks: 32; 24: 8)."""
    return next((L for L in (32, 16, 8, 4, 2) if (-(-n // L) * L - n) * 8 <= n), 1)


def chunk_words(K: int, bits: int, block_size: int) -> int:
    """32-bit words per chunk of the decode path: 4, 2 or 1, the largest dividing a row's words and
    a block's (a chunk never spans two blocks)."""
    words = K * bits // 32
    block = block_size * bits // 32 if block_size else words
    return next(v for v in (4, 2, 1) if words % v == 0 and block % v == 0)


def fc2_tile(N: int, tokens: int, k: int, lanes: int) -> int:
    """Output columns per fc2 CTA of the decode path: 4 columns a task, about one task per lane group
    and slot (k tasks a column quad), doubled while the grid keeps >= 128 CTAs (halving the re-reads
    of fc1's output), at most 64 and k * tile <= 2048 (the CTA's shared memory)."""
    m = min(16, max(1, THREADS // lanes // k))
    while 8 * m <= 64 and 8 * m * k <= YMAX and -(-N // (8 * m)) * tokens >= 128:
        m *= 2
    while 4 * m * k > YMAX:
        m //= 2
    return 4 * m


def staged_bytes(K: int) -> int:
    """Dynamic shared memory of qk_moe_fc1v for an input row of K values (K a multiple of 4): fp32,
    16-byte units in swizzled groups of 8 (qk_moe_swz stays inside a group)."""
    return 16 * 8 * -(-(K // 4) // 8)


def mma_staged_bytes(K: int) -> int:
    """Dynamic shared memory of qk_moe_fc1m for an fp16 input row of K values (K a multiple of 32):
    steps of 8 segments of 32 values, 512 bytes each, zeros past K."""
    return 512 * -(-(K // 32) // 8)


REF_WARPS = 2112  # warps resident together on an H200 (132 SMs x 16): the K-split rules' fixed reference


def _serial_steps(rounds: int, steps: int, parts: int) -> int:
    """Steps a warp runs one after the other: its rounds, each a part of ``steps`` plus one step's
    worth for the loads the first waits for (two steps in flight; measured on the H200,
    docs/perf-notes.md)."""
    return rounds * (-(-steps // parts) + 1)


def mma_parts(tasks: int, K: int) -> int:
    """Warps sharing a task of qk_moe_fc1m (1, 2, 4 or 8), each a run of its steps (8 segments of 32
    values), their sums added in part order: the fewest serial steps with ``tasks`` x parts warps
    over REF_WARPS at a time (ties: fewer parts). A function of the shape alone, so the order is."""
    steps = -(-K // 256)
    return min((1, 2, 4, 8), key=lambda p: (_serial_steps(-(-tasks * p // REF_WARPS), steps, p), p))


def fc2m_parts(k: int, K: int) -> int:
    """Warps sharing a (slot, 16 columns) task of qk_moe_fc2m (1, 2 or 4): a CTA's 8 warps take its k x
    parts pairs in rounds; the fewest serial steps (ties: fewer parts). A function of the shape alone."""
    steps = -(-K // 256)
    return min((1, 2, 4), key=lambda p: (_serial_steps(-(-k * p // 8), steps, p), p))


def fc2m_staged_bytes(k: int, K: int) -> int:
    """Dynamic shared memory of qk_moe_fc2m: the token's k rows of fc1's output as three bf16 planes,
    512 bytes each per step of K (8 segments of 32 values), zeros past K."""
    return 3 * k * 512 * -(-K // 256)


def mma_ctas(tasks: int, warps: int, tokens: int, sms: int) -> int:
    """CTAs per token of qk_moe_fc1m: one per ``warps`` tasks, at most as many as are resident
    together (CTAS_PER_SM per SM, shared by the tokens); the kernel deals task w G + x to warp w of
    CTA x (G CTAs). Which warp takes a task never changes its sums."""
    return max(1, min(-(-tasks // warps), CTAS_PER_SM * sms // tokens))


def fc1_ctas(tasks: int, places: int, tokens: int, sms: int) -> int:
    """CTAs per token of qk_moe_fc1v: its ``tasks`` lane tasks over CTAs of ``places`` each, in the
    fewest rounds the resident CTAs (CTAS_PER_SM per SM, shared by the tokens) allow, then as few
    CTAs as those rounds need (no last round of stragglers beyond the others'). Which CTA takes a
    task never changes its sums: the output bits do not depend on this."""
    need = -(-tasks // places)
    rounds = -(-need // max(1, CTAS_PER_SM * sms // tokens))
    return -(-need // rounds)
