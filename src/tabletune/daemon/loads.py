"""The recent load distribution of a replica (batch size -> weight), decaying each cycle.

From the plugin's step cells (steps and their summed batch sizes per cell) or, without them,
the running-requests gauge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tabletune.daemon.observation import Observation


def step_loads(observation: Observation) -> dict[tuple[int, int], float]:
    """Steps per batch size in the interval, as inclusive ranges ``(b, b)``.

    Cells up to 16 hold one batch size each: exact. A wider cell (17-24, ...) knows only its
    steps and their mean batch size; its steps go to the two batch sizes around that mean,
    weighted so the mean is exact. A cell whose steps all ran at one batch size has an integer
    mean and gives that batch size exactly; otherwise this is the narrowest spread with the
    right mean. T is linear inside a cell (the profile grid is dense to 16, then every 8), so
    the spread changes neither the steps' predicted time nor their tokens at a fixed k.
    """
    per_cell: dict[tuple[int, int], tuple[float, float]] = {}
    for (_, low, high), totals in observation.step_cells.items():
        steps, requests = per_cell.get((low, high), (0.0, 0.0))
        per_cell[(low, high)] = (steps + totals.steps, requests + totals.requests)
    out: dict[tuple[int, int], float] = {}
    for (low, high), (steps, requests) in per_cell.items():
        if steps <= 0:
            continue
        mean = min(max(requests / steps, low), high)
        below = math.floor(mean)
        above_share = mean - below
        for b, share in ((below, 1.0 - above_share), (below + 1, above_share)):
            if share > 1e-12:
                out[(b, b)] = out.get((b, b), 0.0) + steps * share
    return out


@dataclass
class LoadTracker:
    """Exponentially fading batch-size weights; ``memory`` is the share kept per cycle."""

    memory: float
    weights: dict[int, float] = field(default_factory=dict)

    def add(self, observation: Observation) -> None:
        fresh = {low: steps for (low, _), steps in step_loads(observation).items()}
        if not fresh and observation.mean_batch is not None and observation.mean_batch >= 0.5:
            fresh[max(1, round(observation.mean_batch))] = 1.0
        if not fresh:
            return
        total = sum(fresh.values())
        faded = {b: w * self.memory for b, w in self.weights.items() if w * self.memory > 1e-6}
        for b, w in fresh.items():
            faded[b] = faded.get(b, 0.0) + (1.0 - self.memory) * w / total
        self.weights = faded

    def clipped(self, max_batch: int) -> dict[int, float]:
        """Weights with batch sizes above ``max_batch`` counted at ``max_batch``."""
        out: dict[int, float] = {}
        for b, w in self.weights.items():
            key = min(max(1, b), max_batch)
            out[key] = out.get(key, 0.0) + w
        return out
