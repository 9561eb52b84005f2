"""bench/gpu/exploring_pooled.py: exploring's cost over several launches of one code."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.gpu_jobs import load_gpu_module

pooled_module = load_gpu_module("exploring_pooled")


def _windows(loss: float, n: int, table_rate: float, seconds: float = 1.0) -> np.ndarray:
    """n windows whose steps keep (1 - loss) of the table k's rate; half the time table k."""
    rows = [[(1 - loss) * table_rate * seconds, seconds, table_rate * seconds / 2, seconds / 2]]
    return np.array(rows * n)


def test_a_windows_loss_is_its_kept_tokens_rate_against_the_table_ks() -> None:
    assert pooled_module.window_loss(_windows(0.02, 10, 15_000.0)) == pytest.approx(0.02)


def test_launches_are_weighted_by_their_seconds_not_pooled_across_their_rates() -> None:
    # 1 % over 100 s at 19k tokens/s and 3 % over 50 s at 14k: (1 * 100 + 3 * 50) / 150.
    fast, slow = _windows(0.01, 100, 19_000.0), _windows(0.03, 50, 14_000.0)
    together = pooled_module.pooled([fast, slow], draws=50)
    assert together["loss"] == pytest.approx((0.01 * 100 + 0.03 * 50) / 150, abs=1e-4)
    assert together["windows"] == 150
    # Every window of a launch alike: resampling them moves nothing.
    assert together["bootstrap_95"] == [together["loss"], together["loss"]]


@settings(max_examples=30, deadline=None)
@given(
    losses=st.lists(
        st.lists(st.floats(-0.05, 0.1), min_size=2, max_size=12), min_size=1, max_size=3
    )
)
def test_the_pooled_loss_lies_inside_its_interval_and_within_the_launches(
    losses: list[list[float]],
) -> None:
    launches = [
        np.vstack([_windows(loss, 1, 10_000.0 + 1000 * i) for loss in launch])
        for i, launch in enumerate(losses)
    ]
    together = pooled_module.pooled(launches, draws=200)
    low, high = together["bootstrap_95"]
    singles = [pooled_module.window_loss(w) for w in launches]
    assert min(singles) - 1e-4 <= together["loss"] <= max(singles) + 1e-4  # rounded to 4
    assert low - 1e-4 <= together["loss"] <= high + 1e-4


@pytest.mark.parametrize(
    ("loss", "bound", "verdict"),
    [
        (0.010, (0.006, 0.014), "met"),
        (0.010, (0.006, 0.0152), "not judgeable"),
        (0.018, (0.011, 0.024), "missed by point, not judgeable"),
        (0.030, (0.016, 0.04), "missed"),
    ],
)
def test_verdicts_are_worded_as_the_summary_words_them(
    loss: float, bound: tuple[float, float], verdict: str
) -> None:
    assert pooled_module.verdict(loss, bound, 0.015) == verdict
