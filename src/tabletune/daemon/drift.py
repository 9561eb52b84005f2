"""Drift checks, pure: live acceptance vs the prior, live step times vs the profile's T.

Step times drift when work the profile did not capture grows with traffic (DFlash-like drafters
ran 1.3-1.9x the profiled step); the table is then built on wrong T and an operator must know.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tabletune.metric_names import bucket_bounds
from tabletune.solver import SolverError, StepTimes


@dataclass(frozen=True)
class StepDrift:
    k: int
    bucket: str
    live_ms: float
    profile_ms: float
    steps: float

    @property
    def ratio(self) -> float:
        return self.live_ms / self.profile_ms


def profile_ms(step_times: StepTimes, k: int, bucket: str) -> float | None:
    """Mean profile T over the bucket's batch sizes (within the profiled range), or None."""
    low, high = bucket_bounds(bucket)
    high = min(high, step_times.max_batch)
    if k not in step_times.ks or low > high:
        return None
    try:
        return float(np.mean([step_times.at(b, k) for b in range(low, high + 1)]))
    except SolverError:
        return None


def step_drifts(
    step_times: StepTimes,
    totals: Mapping[tuple[int, str], tuple[float, float]],
    *,
    min_steps: int,
    expected_ms: Callable[[int, str], float | None] | None = None,
) -> list[StepDrift]:
    """Every (k, bucket) with enough steps, live mean vs profile (``expected_ms`` may memoise
    ``profile_ms``)."""
    out: list[StepDrift] = []
    for (k, bucket), (seconds, steps) in sorted(totals.items()):
        if steps < min_steps or steps <= 0:
            continue
        expected = (
            expected_ms(k, bucket) if expected_ms is not None else profile_ms(step_times, k, bucket)
        )
        if expected is None:
            continue
        out.append(StepDrift(k, bucket, 1000.0 * seconds / steps, expected, steps))
    return out


def acceptance_gap(rates: Sequence[float], prior: Sequence[float]) -> tuple[int, float]:
    """(position 1-based, a_hat_i - a_prior_i) where the gap is largest in size."""
    gaps = [r - p for r, p in zip(rates, prior, strict=False)]
    index = max(range(len(gaps)), key=lambda i: abs(gaps[i]))
    return index + 1, gaps[index]
