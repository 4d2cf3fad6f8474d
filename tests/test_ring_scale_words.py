"""The MatMulNBits ring decode's fp16 scale copies (ort/nbits_mma.hip, qk_issue_super), modelled
byte for byte: each lane copies the 4-byte word holding its chunk's scale, aligned down, and in the
unchecked superchunks (every one before the row's last) trusts that word to lie inside the scales
unless it is the tensor's one word that reaches past the end (``tail``: 2 bytes then). Checked over
bits, blocks, K, N, CTA heights and the scales' alignment: the word holds the scale; the only word
past the end is ``tail``'s; and only the CTA ending at row N - 1 ever copies it, the rule the
bench-only -DQK_NBITS_RING_TAIL_SPLIT build rests on (its other CTAs skip the test)."""

from __future__ import annotations

import itertools

import pytest


def unchecked_words(bits: int, block: int, K: int, N: int, R: int, base: int):
    """(CTA's first row, row, scale address, word address) of every scale word an unchecked
    superchunk copies, as the kernel computes them (fp16 scales of N rows x k_blocks from
    ``base``; CTAs of 16 R rows, the last shifted to end at N)."""
    sc, cpb = 8 // bits, (block // 64).bit_length() - 1
    k_blocks, n_chunks = -(-K // block), -(-K // 64)
    n_full = -(-n_chunks // sc) - 1
    for row0 in range(0, N, 16 * R):
        rbase = min(row0, N - 16 * R)
        for row, s, t in itertools.product(range(rbase, rbase + 16 * R), range(n_full), range(4)):
            c = s * sc + t % sc
            assert c < n_chunks and c >> cpb < k_blocks  # unchecked: every chunk inside K
            addr = base + (row * k_blocks + (c >> cpb)) * 2
            yield rbase, row, addr, addr & ~3


def tail_of(send: int) -> int:
    """The kernel's ``tail``: the tensor's last 4-aligned word when it reaches past ``send``, else 1."""
    return send - 2 if send & 3 else 1


CASES = [
    (bits, block, K, N, R, base)
    for bits, block in itertools.product((2, 4), (64, 128, 256))
    for K in (block, 2 * block, 3 * block + 64, 1024 + 192)
    for N, R in ((32, 2), (48, 2), (33, 1), (16, 1), (49, 1))
    for base in (0, 2)
]


@pytest.mark.parametrize("bits, block, K, N, R, base", CASES)
def test_unchecked_scale_words(bits: int, block: int, K: int, N: int, R: int, base: int) -> None:
    send = base + N * -(-K // block) * 2
    tail = tail_of(send)
    for rbase, row, addr, word in unchecked_words(bits, block, K, N, R, base):
        assert word <= addr < word + 4  # the word holds the lane's scale
        if word + 4 > send:  # past the end: only the tail word, whose copy takes 2 bytes
            assert word == tail and row == N - 1 and rbase + 16 * R == N, (row, word, send)


def test_the_tail_word_is_copied_unchecked_somewhere() -> None:
    """The cases reach the word the rule is about: with a block wider than a superchunk (u4, block
    256: 128 K values a superchunk) an unchecked superchunk does copy the tail word, so the kernel's
    test cannot be dropped in every CTA; with blocks no wider, never."""
    hits = {
        (bits, block, N, R)
        for bits, block, K, N, R, base in CASES
        for rbase, row, addr, word in unchecked_words(bits, block, K, N, R, base)
        if word + 4 > base + N * -(-K // block) * 2
    }
    assert (4, 256, 33, 1) in hits and all(block > 64 * 8 // bits for bits, block, _, _ in hits), sorted(hits)


def test_the_kernel_computes_what_is_modelled() -> None:
    """The model's rules are the kernel's lines: the word aligned down, the unchecked copy's 2-byte
    tail, ``tail`` itself, and under -DQK_NBITS_RING_TAIL_SPLIT ``tail`` 1 but in the CTA ending at N."""
    from qconform.device.registry import KERNEL_DIR

    source = (KERNEL_DIR / "ort/nbits_mma.hip").read_text()
    for line in (
        "if (!F32) p = (const qk_u8*)((size_t)p & ~(size_t)3);",
        "const int bytes = FULL ? (F32 || NO_TAIL || (qk_u32)(size_t)p != tail ? 4 : 2)",
        "const qk_u32 tail = (size_t)send & 3 ? (qk_u32)(size_t)(send - 2) : 1u;",
        "const qk_u32 tail = (size_t)send & 3 && rbase + 16 * R == N ? (qk_u32)(size_t)(send - 2) : 1u;",
        "const int rbase = min(row0, N - 16 * R);",
        "const int c = s * SC + t % SC;",
    ):
        assert source.count(line) == 1, line
