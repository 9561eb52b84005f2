"""Named reference cases (docs/design.md's worked examples), shared by solver and CLI tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tabletune.solver import StepTimes

WORKED_RATES = (0.7, 0.5, 0.3)


@dataclass(frozen=True)
class Reference:
    name: str
    step_times: StepTimes
    rates: tuple[float, ...]
    expected_k: int
    expected_goodput_per_request: dict[int, float]  # tokens/ms/request at B=1


def single_batch(t1: float, t3: float) -> StepTimes:
    return StepTimes(grid=(1,), ks=(1, 3), ms=np.array([[t1], [t3]]))


REFERENCES = (
    Reference("slow-k3", single_batch(5.0, 8.0), WORKED_RATES, 1, {1: 0.34, 3: 0.3125}),
    Reference("cheap-k3", single_batch(4.5, 6.0), WORKED_RATES, 3, {1: 1.7 / 4.5, 3: 2.5 / 6.0}),
)
