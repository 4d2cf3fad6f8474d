"""The bitsandbytes matrix-unit GEMM's row-tile rule (``qconform.device.bnb_tiling``): two 16-row
tiles a warp step at M = 9..16, and at M <= 8 where 32-row CTA tiles fill every slot; the H200's
(132 SMs, 2 CTAs each) choices for the bench's two layers. Offline (no CuPy)."""

from __future__ import annotations

import pytest

from qconform.device.bnb_tiling import TOKENS, row_tiles

H200_SLOTS = 2 * 132


CASES = [
    (1, 14336, 2),  # 4096 x 14336: 448 tiles of 32 rows for 264 slots
    (8, 14336, 2),
    (1, 4096, 1),  # 14336 x 4096: 128 tiles of 32 rows would leave half the slots empty
    (8, 4096, 1),
    (9, 4096, 2),  # two n-tiles: always two row tiles
    (16, 64, 2),
    (1, 32 * H200_SLOTS, 2),  # the boundary: exactly one 32-row tile a slot
    (1, 32 * H200_SLOTS - 32, 1),
    (1, 32 * H200_SLOTS - 31, 2),  # a partial last tile still fills the last slot
]
MUTANTS = {
    "RT 2 everywhere": lambda M, N, slots: 2,
    "n2 by the slot rule too": lambda M, N, slots: 2 if N // 32 >= slots else 1,
    "tiles rounded down": lambda M, N, slots: 2 if M > TOKENS or N // 32 >= slots else 1,
    "16-row tiles counted": lambda M, N, slots: 2 if M > TOKENS or -(-N // 16) >= slots else 1,
}


@pytest.mark.parametrize("M,N,rt", CASES)
def test_row_tiles(M: int, N: int, rt: int) -> None:
    assert row_tiles(M, N, H200_SLOTS) == rt


@pytest.mark.parametrize("name", MUTANTS)
def test_row_tiles_mutants_caught(name: str) -> None:
    assert any(MUTANTS[name](M, N, H200_SLOTS) != rt for M, N, rt in CASES), name
