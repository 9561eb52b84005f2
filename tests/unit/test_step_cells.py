"""Step-time cells: labels, sums and the wire form shared by plugin, emulator and daemon."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.step_cells import (
    CellTotals,
    StepCellCounter,
    cell_label,
    cell_of,
    cells_from_wire,
    cells_up_to,
    merge_cells,
    parse_cell_label,
)


@pytest.mark.parametrize(
    ("batch", "cell"),
    [(1, (1, 1)), (16, (16, 16)), (17, (17, 24)), (24, (17, 24)), (25, (25, 32)), (128, (121, 128)),
     (129, (129, 136)), (256, (249, 256))],
)  # fmt: skip
def test_cells_are_exact_to_16_then_8_wide_aligned_with_the_profile_grid(
    batch: int, cell: tuple[int, int]
) -> None:
    assert cell_of(batch) == cell


@given(st.integers(min_value=1, max_value=100_000))
def test_every_batch_size_lies_in_its_cell_and_the_label_round_trips(batch: int) -> None:
    low, high = cell_of(batch)
    assert low <= batch <= high
    assert parse_cell_label(cell_label((low, high))) == (low, high)


@given(st.integers(min_value=1, max_value=2_000))
def test_cells_up_to_cover_each_batch_size_once(max_batch: int) -> None:
    cells = cells_up_to(max_batch)
    covered = [b for low, high in cells for b in range(low, high + 1)]
    assert covered[:max_batch] == list(range(1, max_batch + 1))
    assert cells[-1][0] <= max_batch <= cells[-1][1]


@pytest.mark.parametrize(
    "label", ["0", "17", "17-23", "18-25", "-1", "1-1", "a", "", "16-24", " 5"]
)
def test_labels_that_are_not_cells_are_refused(label: str) -> None:
    with pytest.raises(ValueError, match="not a batch cell"):
        parse_cell_label(label)


def test_counter_sums_steps_per_cell_and_round_trips_through_the_wire() -> None:
    counter = StepCellCounter()
    counter.record(batch_size=20, k=3, duration_s=0.010, tokens=80)
    counter.record(batch_size=23, k=3, duration_s=0.012, tokens=600)
    counter.record(batch_size=23, k=2, duration_s=0.011, tokens=69)
    counter.record_without_decode()
    totals = counter.totals()
    cell = totals[(3, 17, 24)]
    assert cell.steps == 2
    assert cell.seconds == pytest.approx(0.022)
    assert cell.seconds_sq == pytest.approx(0.010**2 + 0.012**2)
    assert cell.tokens == 680
    assert cell.mean_batch == pytest.approx(21.5)
    assert cell.variance_s2 == pytest.approx(0.001**2)
    back, without = cells_from_wire(counter.to_wire())
    assert back == totals
    assert without == 1


@pytest.mark.parametrize(
    "wire",
    [
        [],
        {"cells": "x"},
        {"cells": [[3, 17, 24, 1, 1, 1, 1]]},
        {"cells": [[3, 17, 23, 1, 1, 1, 1, 1]]},
        {"cells": [[-1, 1, 1, 1, 1, 1, 1, 1]]},
        {"cells": [[3, 1, 1, 1, -1, 1, 1, 1]]},
        {"cells": [[3, 1, 1, 1, math.inf, 1, 1, 1]]},
        {"cells": [[3, 1, 1, True, 1, 1, 1, 1]]},
        {"cells": [[3.0, 1, 1, 1, 1, 1, 1, 1]]},
        {"cells": [], "steps_without_decode": "7"},
    ],
)
def test_malformed_wire_data_is_refused(wire: object) -> None:
    with pytest.raises(ValueError):
        cells_from_wire(wire)


def test_totals_add_subtract_and_detect_a_restart() -> None:
    a = CellTotals(10, 0.5, 0.125, 500, 200)  # binary fractions: sums are exact
    b = CellTotals(4, 0.25, 0.0625, 100, 80)
    assert (a + b).since(b) == a
    assert b.went_back_from(a)
    assert not a.went_back_from(b)
    assert merge_cells([{(1, 2, 2): a}, {(1, 2, 2): b, (0, 1, 1): b}]) == {
        (1, 2, 2): a + b,
        (0, 1, 1): b,
    }
    assert math.isnan(CellTotals().mean_s)
