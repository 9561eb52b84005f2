"""The push guard's verdicts (pure) and its goodput prediction."""

from __future__ import annotations

import pytest

from tabletune.daemon.guard import GoodputSample, interval_rates, judge, predicted_tokens_per_s
from tabletune.daemon.settings import load_settings
from tabletune.schemas.profile import step_times_of
from tests.unit.daemon_fakes import small_profile

GUARD = load_settings({"TABLETUNE_GUARD__MIN_SAMPLES": "2"}).guard


def samples(start: float, loads: list[float], efficiency: float) -> list[GoodputSample]:
    return [GoodputSample(start + i, b, 100.0 * efficiency, 100.0) for i, b in enumerate(loads)]


def test_drop_at_similar_load_is_a_drop() -> None:
    before = samples(0, [16, 17, 64], 1.0)
    after = samples(10, [16.5, 63], 0.8)
    verdict = judge(before, after, elapsed_s=5, settings=GUARD)
    assert verdict.outcome == "drop"
    assert verdict.change == pytest.approx(-0.2)


def test_small_change_is_ok() -> None:
    verdict = judge(
        samples(0, [16, 16], 1.0), samples(10, [16, 16], 0.95), elapsed_s=5, settings=GUARD
    )
    assert verdict.outcome == "ok" and verdict.change == pytest.approx(-0.05)


def test_different_loads_are_not_compared() -> None:
    before = samples(0, [16, 16, 16], 1.0)
    after = samples(10, [64, 64, 64], 0.5)  # another load: no evidence either way
    assert judge(before, after, elapsed_s=5, settings=GUARD).outcome == "wait"
    assert judge(before, after, elapsed_s=10_000, settings=GUARD).outcome == "inconclusive"


def test_prediction_follows_the_model() -> None:
    st = step_times_of(small_profile())
    rates = (0.8, 0.6, 0.45)
    # All steps at B=16 with k=3: tokens/s = 1000 * 16 * tau(3) / T(16, 3).
    expected = 1000 * 16 * (1 + 0.8 + 0.6 + 0.45) / st.at(16, 3)
    got = predicted_tokens_per_s(st, [(1, 128, 3)], {(16, 16): 50.0}, rates, max_k=3)
    assert got == pytest.approx(expected)


def test_interval_rates_fall_back_where_not_drafted() -> None:
    assert interval_rates((100, 0, 0), (70, 0, 0), (0.8, 0.6, 0.4)) == (0.7, 0.6, 0.4)
