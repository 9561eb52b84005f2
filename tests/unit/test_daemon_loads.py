"""The load distribution from step cells: exact where a cell holds one batch size, the mean
kept exact inside wider cells, and the fading tracker over it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.daemon.loads import LoadTracker, step_loads
from tabletune.daemon.observation import Observation
from tabletune.step_cells import CellKey, CellTotals, StepCellCounter, cell_of


def observed(cells: dict[CellKey, CellTotals], mean_batch: float | None = None) -> Observation:
    return Observation(
        replica="r",
        admin_url="r",
        interval_s=1.0,
        drafted=(),
        accepted=(),
        step_cells=cells,
        mean_batch=mean_batch,
    )


def ran(steps: list[tuple[int, int]]) -> dict[CellKey, CellTotals]:
    """Cells after steps of (batch size, k)."""
    counter = StepCellCounter()
    for batch, k in steps:
        counter.record(batch_size=batch, k=k, duration_s=0.01, tokens=batch * (k + 1))
    return counter.totals()


def test_cells_of_one_batch_size_are_exact_whatever_k() -> None:
    loads = step_loads(observed(ran([(5, 0), (5, 3), (7, 1)])))
    assert loads == {(5, 5): 2.0, (7, 7): 1.0}


def test_a_wide_cell_whose_steps_sat_at_one_batch_size_gives_it_exactly() -> None:
    assert step_loads(observed(ran([(21, 3)] * 4))) == {(21, 21): 4.0}


def test_a_wide_cell_spreads_over_the_two_sizes_around_its_mean() -> None:
    loads = step_loads(observed(ran([(18, 1), (21, 1), (21, 3), (23, 3)])))  # mean 20.75
    assert loads == {(20, 20): pytest.approx(1.0), (21, 21): pytest.approx(3.0)}


@given(
    st.lists(
        st.tuples(st.integers(min_value=1, max_value=300), st.integers(min_value=0, max_value=4)),
        min_size=1,
        max_size=60,
    )
)
def test_steps_and_their_batch_sizes_are_kept_per_cell(steps: list[tuple[int, int]]) -> None:
    loads = step_loads(observed(ran(steps)))
    assert all(low == high for low, high in loads)
    for cell in {cell_of(b) for b, _ in steps}:
        inside = {b: n for (b, _), n in loads.items() if cell[0] <= b <= cell[1]}
        true = [b for b, _ in steps if cell_of(b) == cell]
        assert sum(inside.values()) == pytest.approx(len(true))
        assert sum(b * n for b, n in inside.items()) == pytest.approx(sum(true))
        assert len(inside) <= 2
    assert set(loads) <= {(b, b) for b in range(1, 305)}


def test_tracker_fades_and_falls_back_to_the_running_gauge() -> None:
    tracker = LoadTracker(memory=0.5)
    tracker.add(observed(ran([(4, 1)] * 3)))
    assert tracker.weights == {4: 0.5}
    tracker.add(observed({}, mean_batch=30.4))  # no step cell: the gauge's mean
    assert tracker.weights == {4: 0.25, 30: 0.5}
    tracker.add(observed({}, mean_batch=None))
    assert tracker.weights == {4: 0.25, 30: 0.5}
    assert tracker.clipped(16) == {4: 0.25, 16: 0.5}
