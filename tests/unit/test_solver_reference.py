"""The worked examples of docs/design.md, exactly."""

from __future__ import annotations

import pytest

from tabletune.solver import (
    EstimatorState,
    SolverError,
    build_table,
    estimate,
    goodput,
    observe,
    rebuild_step,
    tau,
)
from tests.unit.references import REFERENCES, WORKED_RATES, Reference


def test_tau_of_the_worked_example() -> None:
    assert tau(WORKED_RATES, 0) == 1.0
    assert tau(WORKED_RATES, 1) == pytest.approx(1.7, abs=1e-12)
    assert tau(WORKED_RATES, 3) == pytest.approx(2.5, abs=1e-12)


@pytest.mark.parametrize("ref", REFERENCES, ids=lambda r: r.name)
def test_worked_example_picks_the_paper_k(ref: Reference) -> None:
    for k, expected in ref.expected_goodput_per_request.items():
        got = goodput(1, k, ref.step_times.at(1, k), ref.rates)
        assert got == pytest.approx(expected, rel=1e-12)
    solution = build_table(ref.step_times, ref.rates)
    assert solution.ranges == ((1, 1, ref.expected_k),)


def test_worked_goodput_values_to_three_digits() -> None:
    assert round(goodput(1, 1, 5.0, WORKED_RATES), 4) == 0.34
    assert round(goodput(1, 3, 8.0, WORKED_RATES), 4) == 0.3125
    assert round(goodput(1, 1, 4.5, WORKED_RATES), 3) == 0.378
    assert round(goodput(1, 3, 6.0, WORKED_RATES), 3) == 0.417


def test_estimator_worked_example() -> None:
    # a_2^prior = 0.5, 2000 drafted, 1200 kept -> (1000 + 1200) / 4000 = 0.55
    state = EstimatorState.start((0.9, 0.5), weight=2000)
    state = observe(state, drafted=(2000, 2000), accepted=(1900, 1200))
    assert estimate(state)[1] == pytest.approx(0.55, abs=1e-12)


def test_request_drafting_three_keeping_two_counts_per_position() -> None:
    state = EstimatorState.start((0.5, 0.5, 0.5), weight=0)
    state = observe(state, drafted=(1, 1, 1), accepted=(1, 1, 0))
    assert estimate(state) == (1.0, 1.0, 0.0)


def test_rebuild_halves_live_counts_and_optionally_the_prior_weight() -> None:
    state = observe(EstimatorState.start((0.5,), weight=2000), drafted=(400,), accepted=(300,))
    rates, after = rebuild_step(state)
    assert rates[0] == pytest.approx((1000 + 300) / 2400)
    assert after.drafted == (200.0,) and after.accepted == (150.0,) and after.weight == 2000
    _, decayed = rebuild_step(state, prior_decay=True)
    assert decayed.weight == 1000


def test_estimator_rejects_impossible_counts() -> None:
    with pytest.raises(SolverError, match="accepted"):
        observe(EstimatorState.start((0.5,)), drafted=(1,), accepted=(2,))
    with pytest.raises(SolverError):
        EstimatorState.start((1.5,))
