"""The phase arithmetic of the GQA decode diagnostic (qconform.bench.gqa_phases): durations between
stamped boundaries, over the CTAs that reached both."""

import numpy as np
import pytest

from qconform.bench.gqa_phases import BOUNDARIES, PHASES, phase_table, spread

KHZ = 2_000_000.0  # 2 GHz: 2000 cycles a us


def _stamps(durations_us: np.ndarray, start: np.ndarray, skipped: dict[int, tuple[int, ...]]) -> np.ndarray:
    """SM clock stamps of CTAs whose phase i takes durations_us[cta, i], from start[cta] cycles; the
    boundaries in skipped[cta] left 0 (not reached), as the kernel leaves them."""
    cycles = np.round(durations_us * KHZ / 1e3).astype(np.int64)
    clock = start[:, None] + np.concatenate([np.zeros((len(start), 1), np.int64), np.cumsum(cycles, 1)], 1)
    for cta, bounds in skipped.items():
        clock[cta, list(bounds)] = 0
    return clock


def test_phases_are_the_durations_of_the_ctas_that_reached_both_boundaries():
    rng = np.random.default_rng(7)
    dur = rng.integers(1, 400, (5, len(PHASES))) / 100.0  # us, exact in cycles at 2 GHz
    start = rng.integers(10**6, 10**7, 5)
    skipped = {3: (5, 6, 7)}  # a split with no key: returns after boundary 4, stamps 8 and 9
    table = phase_table(_stamps(dur, start, skipped), KHZ)
    assert [row[0] for row in table] == list(PHASES)
    for i, (_, med, mx, n) in enumerate(table):
        keep = [c for c in range(5) if not any(b in skipped.get(c, ()) for b in (i, i + 1))]
        assert n == len(keep)
        assert med == pytest.approx(float(np.median(dur[keep, i])), abs=1e-9)
        assert mx == pytest.approx(float(dur[keep, i].max()), abs=1e-9)


def test_a_phase_table_that_counts_unreached_boundaries_is_caught():
    """Mutant: durations taken over every CTA, zeros included (a CTA that skipped the loop)."""

    def unmasked(clock: np.ndarray, khz: float) -> list[tuple[str, float, float, int]]:
        d = (clock[:, 1:] - clock[:, :-1]) / khz * 1e3
        return [(n, float(np.median(d[:, i])), float(d[:, i].max()), len(d)) for i, n in enumerate(PHASES)]

    dur = np.full((4, len(PHASES)), 1.5)
    clock = _stamps(dur, np.array([5000, 9000, 7000, 6000]), {1: (5, 6, 7)})
    assert all(med == 1.5 and mx == 1.5 for _, med, mx, _ in phase_table(clock, KHZ))
    assert any(med != 1.5 or mx != 1.5 for _, med, mx, _ in unmasked(clock, KHZ))


def test_spread_is_measured_from_the_first_entry():
    wall = np.zeros((3, BOUNDARIES), np.int64)
    wall[:, 0] = [1_000_500, 1_000_000, 1_000_200]
    wall[:, -1] = [1_009_000, 1_012_000, 1_010_000]
    assert spread(wall) == pytest.approx((0.2, 0.5, 10.0, 12.0))
