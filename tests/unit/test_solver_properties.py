"""Invariants of the table build and the estimator (hypothesis)."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tabletune.schemas.table import Table
from tabletune.solver import (
    EstimatorState,
    StepTimes,
    TableProblem,
    build_table,
    compress,
    estimate,
    evaluate_table,
    expand,
    goodput_matrix,
    observe,
    solve,
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


@st.composite
def noisy_problems(draw: st.DrawFn, *, exact: bool = False) -> TableProblem:
    """Any valid problem: uncertainty (some cells exact), a running table (some of its k not
    allowed), any confidence, stickiness and min width. ``exact``: no uncertainty or baseline
    and min width 1, the old build's setting (confidence and a zero sigma may still be set)."""
    step_times, rates, allowed, max_batch = draw(problems())
    shape = (len(KS), max_batch)
    sigma = draw(
        st.one_of(st.none(), arrays(float, shape, elements=st.sampled_from([0.0, 0.01, 0.2])))
        if not exact
        else st.one_of(st.none(), st.just(np.zeros(shape)))
    )
    baseline = None
    if not exact:
        baseline = draw(
            st.none() | st.lists(st.sampled_from(KS), min_size=max_batch, max_size=max_batch)
        )
    return TableProblem(
        step_times=step_times,
        rates=rates,
        allowed_k=allowed,
        max_batch=max_batch,
        stickiness=draw(st.sampled_from([0.0, 0.005, 0.05])),
        uncertainty=sigma,
        confidence=draw(st.sampled_from([0.0, 0.5, 1.0, 3.0])),
        baseline=baseline,
        min_width=1 if exact else draw(st.integers(1, 8)),
    )


def goodput_and_sigma(problem: TableProblem) -> tuple[np.ndarray, np.ndarray]:
    g = goodput_matrix(problem.step_times, problem.rates, problem.max_batch)
    relative = 0.0 if problem.uncertainty is None else problem.uncertainty
    return g, g * relative


def sticky_chain(problem: TableProblem) -> list[int]:
    """The build before uncertainty, restated plainly: per B the best allowed k (the smallest on
    a tie) unless the previous B's k is within the stickiness of it."""
    g, _ = goodput_and_sigma(problem)
    choice: list[int] = []
    for column in range(problem.max_batch):
        value = {k: g[KS.index(k), column] for k in problem.allowed_k}
        best = max(sorted(problem.allowed_k), key=lambda k: (value[k], -k))
        if choice and value[best] <= value[choice[-1]] * (1 + problem.stickiness):
            best = choice[-1]
        choice.append(best)
    return choice


@settings(max_examples=200, deadline=None)
@given(noisy_problems())
def test_every_table_covers_1_to_max_with_allowed_k_and_wide_ranges(problem: TableProblem) -> None:
    ranges = solve(problem).ranges
    assert ranges[0][0] == 1 and ranges[-1][1] == problem.max_batch
    for (_, end, _), (start, _, _) in pairwise(ranges):
        assert start == end + 1  # no gap, no overlap
    assert {k for _, _, k in ranges} <= problem.allowed_k
    if len(ranges) > 1:
        assert min(end - start + 1 for start, end, _ in ranges) >= problem.min_width
    Table.parse([list(r) for r in ranges])  # vLLM would accept it


@settings(max_examples=200, deadline=None)
@given(noisy_problems())
def test_the_rule_keeps_its_reference_unless_clearly_beaten(problem: TableProblem) -> None:
    # The reference: the running table's k where it is allowed, else the previous B's choice.
    solution = solve(problem)
    g, sigma = goodput_and_sigma(problem)
    for column, chosen in enumerate(solution.rule_k):
        best = solution.best_k[column]
        ref = None
        if problem.baseline is not None and problem.baseline[column] in problem.allowed_k:
            ref = problem.baseline[column]
        elif column > 0:
            ref = solution.rule_k[column - 1]
        if ref is None:
            assert chosen == best
            continue
        assert chosen == clear_choice(problem, g[:, column], sigma[:, column], ref, best)


def clear_choice(
    problem: TableProblem, g: np.ndarray, sigma: np.ndarray, ref: int, best: int
) -> int:
    """The rule at one B, restated plainly: among the allowed k that beat the reference
    clearly and lie within the best k's noise, the highest goodput (smallest k on a tie);
    none: the reference."""
    z, s = problem.confidence, problem.stickiness

    def beats(q: int, r: int) -> bool:
        gq, gr = g[KS.index(q)], g[KS.index(r)]
        noise = z * np.hypot(sigma[KS.index(q)], sigma[KS.index(r)])
        return bool(gq > gr * (1 + s) and gq - gr > noise)

    def near_best(q: int) -> bool:
        gq, gb = g[KS.index(q)], g[KS.index(best)]
        noise = z * np.hypot(sigma[KS.index(q)], sigma[KS.index(best)])
        return bool(gq * (1 + s) >= gb or gb - gq <= noise)

    candidates = [q for q in sorted(problem.allowed_k) if beats(q, ref) and near_best(q)]
    if not candidates:
        return ref
    return max(candidates, key=lambda q: (g[KS.index(q)], -q))


@settings(max_examples=200, deadline=None)
@given(noisy_problems(exact=True))
def test_without_uncertainty_the_table_is_the_old_sticky_build(problem: TableProblem) -> None:
    solution = solve(problem)
    assert list(solution.per_batch_k) == sticky_chain(problem)
    old = build_table(
        problem.step_times,
        problem.rates,
        allowed_k=problem.allowed_k,
        max_batch=problem.max_batch,
        stickiness=problem.stickiness,
    )
    assert old.ranges == solution.ranges and old.goodput == solution.goodput


@settings(max_examples=200, deadline=None)
@given(noisy_problems())
def test_only_runs_narrower_than_the_min_width_are_relabelled(problem: TableProblem) -> None:
    solution = solve(problem)
    for start, end, _ in compress(solution.rule_k):
        piece = solution.per_batch_k[start - 1 : end]
        if end - start + 1 >= problem.min_width:
            assert piece == solution.rule_k[start - 1 : end]
        else:
            assert len(set(piece)) == 1  # a run moves whole, to one neighbour's k


@settings(max_examples=200, deadline=None)
@given(noisy_problems())
def test_its_own_table_as_the_running_one_is_kept(problem: TableProblem) -> None:
    # No flapping: re-solving from the table just built (same inputs) keeps it.
    first = solve(replace(problem, min_width=1))
    again = solve(replace(problem, min_width=1, baseline=first.per_batch_k))
    assert again.ranges == first.ranges


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
