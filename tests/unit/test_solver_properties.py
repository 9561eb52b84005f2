"""Invariants of the table build and the estimator (hypothesis)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune.schemas.table import Table
from tabletune.solver import (
    EstimatorState,
    StepTimes,
    build_table,
    estimate,
    evaluate_table,
    expand,
    goodput_matrix,
    observe,
)

KS = (0, 1, 2, 3)


@st.composite
def problems(draw: st.DrawFn) -> tuple[StepTimes, tuple[float, ...], frozenset[int], int]:
    grid_size = draw(st.integers(1, 12))
    steps = draw(st.lists(st.integers(1, 40), min_size=grid_size, max_size=grid_size))
    grid = tuple(int(x) for x in np.cumsum(steps) - steps[0] + 1)
    ms = np.array([[draw(st.floats(1.0, 60.0)) for _ in grid] for _ in KS], dtype=float)
    rates = sorted((draw(st.floats(0.0, 1.0)) for _ in range(3)), reverse=True)
    allowed = frozenset(draw(st.sets(st.sampled_from(KS), min_size=1)))
    max_batch = draw(st.integers(1, grid[-1]))
    return StepTimes(grid=grid, ks=KS, ms=ms), tuple(rates), allowed, max_batch


@settings(max_examples=200, deadline=None)
@given(problems())
def test_table_covers_every_batch_with_allowed_k_near_the_best(
    problem: tuple[StepTimes, tuple[float, ...], frozenset[int], int],
) -> None:
    step_times, rates, allowed, max_batch = problem
    solution = build_table(step_times, rates, allowed_k=allowed, max_batch=max_batch)
    ranges = solution.ranges
    assert ranges[0][0] == 1 and ranges[-1][1] == max_batch
    for (_, end, _), (start, _, _) in pairwise(ranges):
        assert start == end + 1  # no gap, no overlap
    assert {k for _, _, k in ranges} <= allowed
    Table.parse([list(r) for r in ranges])  # vLLM would accept it
    g = goodput_matrix(step_times, rates, max_batch)
    rows = [KS.index(k) for k in sorted(allowed)]
    best = g[rows].max(axis=0)
    for b, k in enumerate(expand(ranges, max_batch)):
        assert g[KS.index(k), b] * 1.005 >= best[b] * (1 - 1e-12)


@settings(max_examples=100, deadline=None)
@given(problems())
def test_own_table_never_loses_more_than_stickiness_vs_best_fixed(
    problem: tuple[StepTimes, tuple[float, ...], frozenset[int], int],
) -> None:
    step_times, rates, _, max_batch = problem
    solution = build_table(step_times, rates, max_batch=max_batch)
    evaluation = evaluate_table(step_times, rates, solution.ranges, max_batch=max_batch)
    assert evaluation.worst_loss()[1] <= 0.005 / 1.005 + 1e-9


@settings(max_examples=200, deadline=None)
@given(
    prior=st.lists(st.floats(0, 1), min_size=1, max_size=6),
    weight=st.floats(0, 10_000),
    counts=st.lists(st.tuples(st.integers(0, 10**6), st.floats(0, 1)), min_size=6, max_size=6),
)
def test_estimate_is_a_probability_and_non_increasing(
    prior: list[float], weight: float, counts: list[tuple[int, float]]
) -> None:
    size = len(prior)
    drafted = [c[0] for c in counts[:size]]
    accepted = [int(d * f) for d, f in counts[:size]]
    state = observe(EstimatorState.start(prior, weight=weight), drafted, accepted)
    rates = estimate(state)
    assert all(0.0 <= a <= 1.0 for a in rates)
    assert all(later <= earlier for earlier, later in pairwise(rates))


@settings(max_examples=100, deadline=None)
@given(prior=st.floats(0, 1), live=st.floats(0, 1), weight=st.floats(1, 5000))
def test_estimate_moves_toward_the_live_ratio_as_counts_grow(
    prior: float, live: float, weight: float
) -> None:
    errors = []
    for drafted in (10, 100, 1_000, 10_000, 100_000):
        state = observe(
            EstimatorState.start((prior,), weight=weight), (drafted,), (drafted * live,)
        )
        errors.append(abs(estimate(state)[0] - live))
    assert all(b <= a + 1e-12 for a, b in pairwise(errors))
    assert errors[-1] <= abs(prior - live) * weight / (weight + 100_000) + 1e-9


def test_stickiness_keeps_a_near_tie_from_fragmenting_the_table() -> None:
    # k=1 and k=2 alternate being better by 0.1 %: without stickiness the table would flip at
    # every batch size.
    grid = tuple(range(1, 21))
    base = np.linspace(5.0, 9.0, len(grid))
    wobble = np.where(np.arange(len(grid)) % 2 == 0, 1.001, 0.999)
    rates = (0.5, 0.0)  # tau(1) == tau(2): only T decides
    ms = np.vstack([base * wobble, base / wobble])
    st_ = StepTimes(grid=grid, ks=(1, 2), ms=ms)
    assert len(build_table(st_, rates, stickiness=0.0).ranges) > 5
    assert len(build_table(st_, rates).ranges) == 1


def test_disallowed_or_unprofiled_k_is_refused() -> None:
    st_ = StepTimes(grid=(1, 2), ks=(0, 1), ms=np.ones((2, 2)))
    with pytest.raises(ValueError, match="not profiled"):
        build_table(st_, (0.5,), allowed_k={2})
