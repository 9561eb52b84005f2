"""TableProblem: validated on construction (one clear SolverError), and a stable fingerprint."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from tabletune.solver import SolverError, StepTimes, TableProblem

STEP_TIMES = StepTimes(
    grid=(1, 2, 3, 4), ks=(0, 1, 3), ms=np.array([[4.0, 4.2, 4.4, 4.6], [5, 5, 6, 6], [6, 6, 7, 8]])
)


def problem(**changes: Any) -> TableProblem:
    fields: dict[str, Any] = {
        "step_times": STEP_TIMES,
        "rates": (0.7, 0.5, 0.3),
        "allowed_k": frozenset({0, 1, 3}),
        "max_batch": 4,
    }
    return TableProblem(**(fields | changes))


def test_defaults_are_the_documented_ones() -> None:
    p = problem()
    assert (p.stickiness, p.confidence, p.min_width) == (0.005, 1.0, 1)
    assert p.uncertainty is None and p.baseline is None


def test_inputs_are_normalised_and_frozen() -> None:
    p = problem(rates=[0.7, 0.5, 0.3], allowed_k=[3, 0], baseline=[1, 1, 3, 3])
    assert p.rates == (0.7, 0.5, 0.3) and p.allowed_k == frozenset({0, 3})
    assert p.baseline == (1, 1, 3, 3)
    sigma = np.full((3, 4), 0.01)
    q = problem(uncertainty=sigma)
    sigma[0, 0] = 5.0  # the caller's array is copied, not shared
    assert q.uncertainty is not None and q.uncertainty[0, 0] == 0.01
    with pytest.raises(ValueError, match="read-only"):
        q.uncertainty[0, 0] = 1.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rates": (0.7, 1.5, 0.3)}, r"a_2=1.5 is outside \[0, 1\]"),
        ({"rates": (0.7,)}, "acceptance known up to K=1 but k=3 was profiled"),
        ({"allowed_k": frozenset()}, "the allowed set of k is empty"),
        ({"allowed_k": frozenset({0, 2})}, r"allowed k \[2\] were not profiled"),
        ({"max_batch": 0}, "max_batch=0 is outside the profiled 1..4"),
        ({"max_batch": 5}, "max_batch=5 is outside the profiled 1..4"),
        ({"stickiness": -0.1}, "stickiness must be a finite number >= 0"),
        ({"stickiness": float("nan")}, "stickiness must be a finite number >= 0"),
        ({"confidence": -1.0}, "confidence must be a finite number >= 0"),
        ({"confidence": float("inf")}, "confidence must be a finite number >= 0"),
        ({"min_width": 0}, "min_width must be an integer >= 1"),
        ({"uncertainty": np.zeros((3, 3))}, r"uncertainty shape \(3, 3\) != \(len\(ks\), max_b"),
        ({"uncertainty": np.full((3, 4), -0.1)}, "uncertainty must be finite and >= 0"),
        ({"uncertainty": np.full((3, 4), np.nan)}, "uncertainty must be finite and >= 0"),
        ({"baseline": (1, 1, 3)}, "baseline has 3 entries, expected one per B = 1..4"),
        ({"baseline": (1, 1, -3, 1)}, "baseline k at B=3 is -3"),
    ],
)
def test_bad_problems_are_refused_with_one_clear_error(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(SolverError, match=message):
        problem(**changes)


def test_fingerprint_is_stable_and_tells_every_input_apart() -> None:
    base = problem(uncertainty=np.full((3, 4), 0.01), baseline=(1, 1, 3, 3))
    twin = problem(uncertainty=np.full((3, 4), 0.01), baseline=[1, 1, 3, 3])
    assert base.fingerprint == twin.fingerprint and base == twin and hash(base) == hash(twin)
    assert {base: "memo"}[twin] == "memo"
    other_times = StepTimes(grid=STEP_TIMES.grid, ks=STEP_TIMES.ks, ms=STEP_TIMES.ms * 1.01)
    variants = [
        replace(base, step_times=other_times),
        replace(base, rates=(0.7, 0.5, 0.29)),
        replace(base, allowed_k=frozenset({1, 3})),
        replace(base, max_batch=3, uncertainty=np.full((3, 3), 0.01), baseline=(1, 1, 3)),
        replace(base, stickiness=0.01),
        replace(base, uncertainty=np.full((3, 4), 0.02)),
        replace(base, uncertainty=None),
        replace(base, confidence=2.0),
        replace(base, baseline=(1, 1, 1, 3)),
        replace(base, baseline=None),
        replace(base, min_width=2),
    ]
    prints = {v.fingerprint for v in variants}
    assert len(prints) == len(variants) and base.fingerprint not in prints
    assert all(v != base for v in variants)
