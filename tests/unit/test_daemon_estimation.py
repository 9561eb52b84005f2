"""The daemon's estimator bookkeeping against the solver's one-rebuild-at-a-time definition."""

from __future__ import annotations

import pytest

from tabletune.daemon.estimation import UnitEstimator, repeated_rebuilds
from tabletune.daemon.settings import load_settings
from tabletune.solver import EstimatorState, observe, rebuild_step


@pytest.mark.parametrize("decay", [False, True])
def test_closed_form_equals_successive_rebuilds(decay: bool) -> None:
    state = EstimatorState(
        prior=(0.8, 0.6, 0.4),
        weight=2000.0,
        drafted=(900.0, 700.0, 100.0),
        accepted=(800.0, 500.0, 30.0),
    )
    chunk_d, chunk_a = (3000.0, 3000.0, 2000.0), (1500.0, 900.0, 300.0)
    looped = state
    rates = ()
    for _ in range(7):
        looped = observe(looped, chunk_d, chunk_a)
        rates, looped = rebuild_step(looped, prior_decay=decay)
    got_rates, got = repeated_rebuilds(state, chunk_d, chunk_a, 7, prior_decay=decay)
    assert got_rates == pytest.approx(rates, rel=1e-12)
    assert got.drafted == pytest.approx(looped.drafted, rel=1e-12)
    assert got.accepted == pytest.approx(looped.accepted, rel=1e-12)
    assert got.weight == pytest.approx(looped.weight)


def test_design_example_one_rebuild() -> None:
    # docs/design.md: a_2 prior 0.5, 2000 drafted, 1200 kept -> (1000 + 1200) / 4000 = 0.55.
    settings = load_settings({"TABLETUNE_ESTIMATOR__REBUILD_EVERY_DRAFTS": "2000"}).estimator
    assert settings.prior_decay  # halves w after the estimate: the estimate itself is the same
    unit = UnitEstimator.start((0.7, 0.5, 0.3), settings=settings)
    assert unit.add((2000, 2000, 0), (1400, 1200, 0), settings=settings)
    assert unit.rates[1] == pytest.approx(0.55)
    assert unit.state.drafted == (1000.0, 1000.0, 0.0)  # halved after the rebuild


def test_few_drafts_accumulate_without_rebuilding() -> None:
    settings = load_settings({"TABLETUNE_ESTIMATOR__REBUILD_EVERY_DRAFTS": "1000"}).estimator
    unit = UnitEstimator.start((0.7, 0.5, 0.3), settings=settings)
    assert not unit.add((600, 600, 600), (300, 200, 100), settings=settings)
    assert unit.rates == (0.7, 0.5, 0.3)
    assert unit.add((600, 600, 600), (300, 200, 100), settings=settings)
    assert unit.rebuilds == 1
    assert unit.drafts_since_rebuild == pytest.approx(200)


def test_a_big_cycle_is_many_rebuilds_and_forgets_fast() -> None:
    settings = load_settings(
        {
            "TABLETUNE_ESTIMATOR__REBUILD_EVERY_DRAFTS": "10000",
            "TABLETUNE_ESTIMATOR__PRIOR_DECAY": "0",
        }
    ).estimator
    unit = UnitEstimator.start((0.8, 0.6, 0.4), settings=settings)
    unit.add((200_000,) * 3, (160_000, 120_000, 80_000), settings=settings)
    assert unit.rebuilds == 20
    unit.add((200_000,) * 3, (100_000, 40_000, 10_000), settings=settings)  # a switch
    # Prior weight 2000 against ~20000 recent drafts: ~9 % prior, the rest the new traffic.
    assert unit.rates[0] == pytest.approx(0.5 + (0.8 - 0.5) * 2000 / 22000, abs=0.01)
