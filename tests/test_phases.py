"""The phase arithmetic of the decode diagnostic (qconform.bench.phases): durations between stamped
boundaries over the CTAs that reached both, and when each marked kernel's CTAs enter and end."""

import numpy as np
import pytest

from qconform.bench.phases import GQA, KQ, KQ_BULK, QMOE, SLOTS, Marked, phase_table, report, spread

KHZ = 2_000_000.0  # 2 GHz: 2000 cycles a us


def _stamps(marked: Marked, durations_us: np.ndarray, start: np.ndarray, skipped: dict[int, tuple[int, ...]]):
    """[CTAs, SLOTS] SM clock stamps of CTAs whose phase i of ``marked`` takes durations_us[cta, i],
    from start[cta] cycles; the boundaries in skipped[cta] left 0 (not reached), as the kernel leaves
    them, and every slot outside ``marked`` 0."""
    cycles = np.round(durations_us * KHZ / 1e3).astype(np.int64)
    marks = start[:, None] + np.concatenate([np.zeros((len(start), 1), np.int64), np.cumsum(cycles, 1)], 1)
    clock = np.zeros((len(start), SLOTS), np.int64)
    clock[:, marked.first : marked.last + 1] = marks
    for cta, bounds in skipped.items():
        clock[cta, list(bounds)] = 0
    return clock


@pytest.mark.parametrize("marked", [*GQA, *QMOE, *KQ, KQ_BULK[0]], ids=lambda m: m.kernel)
def test_phases_are_the_durations_of_the_ctas_that_reached_both_boundaries(marked):
    rng = np.random.default_rng(7)
    dur = rng.integers(1, 400, (5, len(marked.phases))) / 100.0  # us, exact in cycles at 2 GHz
    start = rng.integers(10**6, 10**7, 5)
    skipped = {3: (marked.first + 2, marked.first + 3)}  # e.g. a split with no key skips the loop's marks
    table = phase_table(_stamps(marked, dur, start, skipped), marked, KHZ)
    assert [row[0] for row in table] == list(marked.phases)
    for i, (_, med, mx, n) in enumerate(table):
        keep = [c for c in range(5) if not any(marked.first + b in skipped.get(c, ()) for b in (i, i + 1))]
        assert n == len(keep)
        assert med == pytest.approx(float(np.median(dur[keep, i])), abs=1e-9)
        assert mx == pytest.approx(float(dur[keep, i].max()), abs=1e-9)


def test_a_phase_table_that_counts_unreached_boundaries_is_caught():
    """Mutant: durations taken over every CTA, zeros included (a CTA that skipped the loop)."""
    (marked,) = GQA

    def unmasked(clock: np.ndarray, m: Marked, khz: float) -> list[tuple[str, float, float, int]]:
        d = (clock[:, m.first + 1 : m.last + 1] - clock[:, m.first : m.last]) / khz * 1e3
        return [(n, float(np.median(d[:, i])), float(d[:, i].max()), len(d)) for i, n in enumerate(m.phases)]

    dur = np.full((4, len(marked.phases)), 1.5)
    clock = _stamps(marked, dur, np.array([5000, 9000, 7000, 6000]), {1: (5, 6, 7)})
    assert all(med == 1.5 and mx == 1.5 for _, med, mx, _ in phase_table(clock, marked, KHZ))
    assert any(med != 1.5 or mx != 1.5 for _, med, mx, _ in unmasked(clock, marked, KHZ))


def test_spread_is_measured_from_the_calls_first_entry_per_kernel():
    fc1, fc2 = QMOE
    wall = np.zeros((3, SLOTS), np.int64)
    wall[:, fc1.first] = [1_000_500, 1_000_000, 1_000_200]
    wall[:, fc1.last] = [1_009_000, 1_012_000, 1_010_000]
    wall[:2, fc2.first] = [1_011_000, 1_011_500]  # fc2 has 2 CTAs: the third row's slots stay 0
    wall[:2, fc2.last] = [1_020_000, 1_021_000]
    assert spread(wall, fc1, 1_000_000) == pytest.approx((0.2, 0.5, 10.0, 12.0))
    assert spread(wall, fc2, 1_000_000) == pytest.approx((11.25, 11.5, 20.5, 21.0))
    stamps = np.stack([np.zeros_like(wall), wall], axis=2)
    lines = report(stamps, QMOE, KHZ)
    assert lines[0].startswith("qk_moe_fc1m: CTAs enter at 0.20 / 0.50 us")
    assert any(line.startswith("qk_moe_fc2m: CTAs enter at 11.25 / 11.50 us") for line in lines)


def test_the_marked_boundaries_fit_the_kernels_slots():
    """Each kernel's boundaries inside QK_PHASE_SLOTS and apart from the other kernels' of its module."""
    for kernels in (GQA, QMOE, KQ, (*KQ, KQ_BULK[0])):
        taken = [b for m in kernels for b in range(m.first, m.last + 1)]
        assert len(taken) == len(set(taken)) and max(taken) < SLOTS


def test_the_tables_boundaries_are_the_kernels_marks():
    """The boundaries the tables read are those the sources mark, and the array's shape is the header's
    (a mark renumbered in a kernel, or a slot count changed, would shift every phase)."""
    import re
    from pathlib import Path

    from qconform.bench.phases import CTAS

    kernels = Path(__file__).resolve().parents[1] / "src/qconform/device/kernels"
    header = (kernels / "common/qk_phases.h").read_text()
    assert f"#define QK_PHASE_SLOTS {SLOTS}\n" in header and f"#define QK_PHASE_CTAS {CTAS}\n" in header
    for source, marked in (("ort/gqa.hip", GQA), ("ort/qmoe.hip", QMOE), ("ggml/keep_quant_fast.hip", (*KQ, *KQ_BULK))):
        text = (kernels / source).read_text()
        marks = {int(n) for n in re.findall(r"\bQK_PHASE(?:_AFTER)?\((\d+)", text)}
        assert marks == {b for m in marked for b in range(m.first, m.last + 1)}, source


def _sm_stamps(sm_of_cta: list[int], unstamped: tuple[int, ...] = ()) -> np.ndarray:
    """Slot values of QK_PHASE_SM: each CTA's SM plus one, 0 where a CTA did not stamp."""
    sm = np.array(sm_of_cta, np.int64) + 1
    sm[list(unstamped)] = 0
    return sm


def test_sm_sharing_counts_the_row_group_ctas_on_the_quantizing_ctas_sms():
    from qconform.bench.phases import sm_sharing

    # 10 SMs, 2 quantizing CTAs, 30 CTAs dealt one an SM in index order: CTAs 10, 11, 20, 21 share SMs 0 and 1
    line = sm_sharing(_sm_stamps([i % 10 for i in range(30)]), 2)
    assert line == "quantizing CTAs on 2 SMs; 4 of 28 row-group CTAs share those SMs"
    # dealt otherwise (CTA i on SM 3i mod 10): SMs 0 and 3 hold the quantizing CTAs; CTAs 10, 20 (SM 0)
    # and 11, 21 (SM 3) share them, and CTA 21 is left unstamped
    line = sm_sharing(_sm_stamps([3 * i % 10 for i in range(30)], unstamped=(21,)), 2)
    assert line == "quantizing CTAs on 2 SMs; 3 of 27 row-group CTAs share those SMs"
    # dealt so that no row-group CTA shares an SM with a quantizing CTA
    line = sm_sharing(_sm_stamps([0, 1] + [2 + i % 8 for i in range(28)]), 2)
    assert line == "quantizing CTAs on 2 SMs; 0 of 28 row-group CTAs share those SMs"


def test_the_sm_slot_is_the_kernels_and_apart_from_its_boundaries():
    import re
    from pathlib import Path

    from qconform.bench.phases import KQ_SM_SLOT

    text = (Path(__file__).resolve().parents[1] / "src/qconform/device/kernels/ggml/keep_quant_fast.hip").read_text()
    assert re.search(rf"#define KF_SM_SLOT {KQ_SM_SLOT}\b", text)
    assert KQ_SM_SLOT < SLOTS and KQ_SM_SLOT not in {b for m in (*KQ, *KQ_BULK) for b in range(m.first, m.last + 1)}


def _ends_case() -> tuple:
    """The one-launch kernel's marks and stamps of 1 quantizing and 3 row-group CTAs: each row's end (ns) and
    SM plus one (the row-group CTAs 0 and 2 on SM 4, CTA 1 on SM 7)."""
    (marked, _) = KQ
    wall = np.zeros((4, SLOTS), np.int64)
    wall[:, marked.last] = [3_000, 13_000, 10_000, 11_000]  # ns; row 0 is the quantizing CTA
    return marked, wall, np.array([2, 5, 8, 5])


def test_ends_by_load_groups_the_ctas_by_their_strided_row_groups_and_their_sms():
    """7 row groups on 3 row-group CTAs after 1 quantizing CTA: CTA 0 takes groups 0, 3, 6 and CTAs 1, 2
    two each (the stride of kf_roll_rows / kf_bulk_gemv); CTAs 0 and 2 share SM 4 (5 groups), CTA 1 is
    on SM 7. A split into contiguous ranges (3, 3, 1 groups) would count otherwise."""
    from qconform.bench import phases
    from qconform.bench.phases import ends_by_load

    marked, wall, sm = _ends_case()
    lines = ends_by_load(wall, sm, marked, 1_000, 1, 3, 7)
    assert phases.strided_groups(np.arange(3), 7, 3).tolist() == [3, 2, 2]
    assert phases.strided_groups(np.arange(4), 2, 4).tolist() == [1, 1, 0, 0]  # more CTAs than groups
    assert lines == [
        "| row groups a CTA | CTAs | end us median | end us max |",
        "|---|---|---|---|",
        "| 2 | 2 | 9.50 | 10.00 |",
        "| 3 | 1 | 12.00 | 12.00 |",
        "| row groups its SM's CTAs | CTAs | end us median | end us max |",
        "|---|---|---|---|",
        "| 2 | 1 | 9.00 | 9.00 |",
        "| 5 | 2 | 11.00 | 12.00 |",
    ]


def test_ends_by_load_with_contiguous_ranges_is_caught(monkeypatch):
    """Mutant: the groups counted as contiguous ranges (CTA c: groups floor(c G / C) .. floor((c + 1) G / C): 2, 2
    and 3 of 7 on 3 CTAs, where the stride gives 3, 2, 2) give other tables for the same stamps."""
    from qconform.bench import phases

    marked, wall, sm = _ends_case()
    shipped = phases.ends_by_load(wall, sm, marked, 1_000, 1, 3, 7)
    monkeypatch.setattr(phases, "strided_groups", lambda c, groups, ctas: (c + 1) * groups // ctas - c * groups // ctas)
    assert phases.strided_groups(np.arange(3), 7, 3).tolist() == [2, 2, 3]
    assert phases.ends_by_load(wall, sm, marked, 1_000, 1, 3, 7) != shipped


def test_the_row_group_size_is_the_kernels():
    import re
    from pathlib import Path

    from qconform.bench.phases import KQ_ROWS

    text = (Path(__file__).resolve().parents[1] / "src/qconform/device/kernels/ggml/keep_quant_fast.hip").read_text()
    assert re.search(rf"#define KF_ROWS {KQ_ROWS}\b", text)
