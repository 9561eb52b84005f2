"""Pure timing arithmetic: the grid, the step from two durations, outliers, cells."""

from __future__ import annotations

import pytest

from tabletune.errors import InputError
from tabletune.profiler.errors import MeasurementError
from tabletune.profiler.timing import (
    batch_grid,
    build_cells,
    explicit_grid,
    step_ms,
    suspicious_cells,
)


def test_grid_is_dense_then_stepped_and_ends_at_max_num_seqs() -> None:
    grid = batch_grid(256)
    assert grid[:16] == tuple(range(1, 17))
    assert grid[16:19] == (24, 32, 40)
    assert grid[-2:] == (248, 256)
    assert len(grid) == 46
    assert batch_grid(20) == (*range(1, 17), 20)
    assert batch_grid(10) == tuple(range(1, 11))
    assert batch_grid(100, dense_until=4, step=32) == (1, 2, 3, 4, 36, 68, 100)
    with pytest.raises(InputError):
        batch_grid(0)


def test_an_explicit_grid_is_sorted_and_bounded() -> None:
    assert explicit_grid((96, 88, 89, 88), 256) == (88, 89, 96)
    for bad in ((), (0, 4), (300,)):
        with pytest.raises(InputError):
            explicit_grid(bad, 256)


def test_step_is_the_extra_time_of_the_long_request_per_extra_token() -> None:
    # 1 token: prefill + overheads = 40 ms; 65 tokens: + 64 steps of 5 ms
    assert step_ms(0.040, 0.040 + 64 * 0.005, 64) == pytest.approx(5.0)
    assert step_ms(0.1, 0.1 + 32 * 0.0125, 32) == pytest.approx(12.5)
    with pytest.raises(ValueError):
        step_ms(0.1, 0.2, 0)


def row(values: dict[int, float], k: int = 2) -> dict[tuple[int, int], list[float]]:
    return {(b, k): [v, v, v] for b, v in values.items()}


GRID = (1, 2, 3, 4, 5, 6)


def test_one_jump_is_suspicious_and_its_neighbours_are_not() -> None:
    samples = row({1: 4.5, 2: 4.6, 3: 4.6, 4: 14.5, 5: 4.7, 6: 4.8})
    assert suspicious_cells(samples, GRID, factor=1.5) == [(4, 2)]


def test_a_steady_rise_or_a_step_that_stays_up_is_not_suspicious() -> None:
    rise = row({b: 4.0 + 1.5 * b for b in GRID})
    assert suspicious_cells(rise, GRID, factor=1.5) == []
    step = row({1: 5.0, 2: 5.0, 3: 5.0, 4: 10.0, 5: 10.0, 6: 10.0})
    assert suspicious_cells(step, GRID, factor=1.5) == []


def test_a_jump_at_the_end_of_the_grid_is_found() -> None:
    samples = row({1: 5.0, 2: 5.0, 3: 5.0, 4: 5.0, 5: 5.0, 6: 9.0})
    assert suspicious_cells(samples, GRID, factor=1.5) == [(6, 2)]


def test_a_dip_is_as_suspicious_as_a_jump_and_rows_are_separate() -> None:
    samples = {**row({b: 10.0 for b in GRID}, k=0), **row({b: 10.0 for b in GRID}, k=1)}
    samples[(3, 1)] = [5.0, 5.0, 5.0]
    samples[(6, 0)] = [30.0, 30.0, 31.0]
    assert suspicious_cells(samples, GRID, factor=1.5) == [(6, 0), (3, 1)]


def test_a_non_positive_sample_is_suspicious_whatever_its_median() -> None:
    samples = row({b: 5.0 for b in GRID})
    samples[(2, 2)] = [5.0, -0.1, 5.0]
    assert suspicious_cells(samples, GRID, factor=1.5) == [(2, 2)]


def test_cells_keep_every_sample_their_median_and_the_noisy_flag() -> None:
    samples = {(1, 0): [5.0, 9.0, 4.0], (2, 0): [6.0, 6.5, 6.1, 30.0]}
    cells = build_cells(samples, {(2, 0)})
    assert [(c.batch_size, c.step_ms, c.noisy) for c in cells] == [
        (1, 5.0, False),
        (2, pytest.approx(6.3), True),
    ]
    assert cells[1].samples_ms == (6.0, 6.5, 6.1, 30.0)
    with pytest.raises(MeasurementError, match="B=1 k=0"):
        build_cells({(1, 0): [5.0, 0.0, 5.0]}, set())
