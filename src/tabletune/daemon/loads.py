"""The recent load distribution of a replica (batch size -> weight), decaying each cycle.

From the decode batch-size histogram (steps spread evenly over each bucket's batch sizes) or,
without it, the running-requests gauge.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tabletune.daemon.observation import Observation


def step_loads(observation: Observation) -> dict[tuple[int, int], float]:
    """Steps per inclusive batch range in the interval. The histogram's buckets are wide
    (129-192) and T can jump inside one, so when every step fell in one bucket its mean (exact,
    from _sum/_count) stands for it; otherwise steps spread evenly over each bucket."""
    buckets = dict(observation.load_buckets)
    mean = observation.mean_batch
    if len(buckets) == 1 and mean is not None:
        (low, high), count = next(iter(buckets.items()))
        if low <= mean <= high:
            point = max(1, round(mean))
            return {(point, point): count}
    return buckets


@dataclass
class LoadTracker:
    """Exponentially fading batch-size weights; ``memory`` is the share kept per cycle."""

    memory: float
    weights: dict[int, float] = field(default_factory=dict)

    def add(self, observation: Observation) -> None:
        fresh: dict[int, float] = {}
        for (low, high), count in step_loads(observation).items():
            share = count / (high - low + 1)
            for b in range(low, high + 1):
                fresh[b] = fresh.get(b, 0.0) + share
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
