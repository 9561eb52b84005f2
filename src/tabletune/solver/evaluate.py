"""Scoring any table against (T, a): per-load loss vs the best fixed k at that load, the
worst-load loss, and the predicted goodput under a load distribution."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tabletune.solver.errors import SolverError
from tabletune.solver.model import StepTimes, goodput_matrix
from tabletune.solver.ranges import Range, expand


@dataclass(frozen=True)
class Evaluation:
    """How one table does at each load B = 1..max_batch (goodput in tokens/ms)."""

    per_batch_k: tuple[int, ...]
    goodput: tuple[float, ...]
    best_fixed_k: tuple[int, ...]
    best_fixed_goodput: tuple[float, ...]

    @property
    def max_batch(self) -> int:
        return len(self.goodput)

    def loss(self, batch_size: int) -> float:
        """1 - G_table / G_best_fixed at this load (0 = as good as the best fixed k)."""
        i = batch_size - 1
        return 1.0 - self.goodput[i] / self.best_fixed_goodput[i]

    def losses(self, loads: Sequence[int] | None = None) -> dict[int, float]:
        loads = range(1, self.max_batch + 1) if loads is None else loads
        return {b: self.loss(b) for b in loads}

    def worst_loss(self, loads: Sequence[int] | None = None) -> tuple[int, float]:
        """(load, loss) of the worst load."""
        losses = self.losses(loads)
        worst = max(losses, key=lambda b: losses[b])
        return worst, losses[worst]

    def mean_goodput(self, load_weights: Mapping[int, float]) -> float:
        return weighted_goodput(self.goodput, load_weights)


def weighted_goodput(per_batch: Sequence[float], load_weights: Mapping[int, float]) -> float:
    """Expected goodput (tokens/ms) when batch size B occurs with weight load_weights[B]."""
    total = float(sum(load_weights.values()))
    if total <= 0:
        raise SolverError("load weights must sum to a positive number")
    value = 0.0
    for b, w in load_weights.items():
        if w < 0:
            raise SolverError(f"load weight for B={b} is negative")
        if not 1 <= b <= len(per_batch):
            raise SolverError(f"load B={b} is outside 1..{len(per_batch)}")
        value += w * per_batch[b - 1]
    return value / total


def evaluate_table(
    step_times: StepTimes,
    rates: Sequence[float],
    ranges: Sequence[Range],
    *,
    max_batch: int | None = None,
    max_k: int | None = None,
) -> Evaluation:
    """Score ``ranges`` (capped at ``max_k`` as vLLM caps at K) against the best fixed k."""
    max_batch = step_times.max_batch if max_batch is None else max_batch
    per_batch = expand(ranges, max_batch)
    if max_k is not None:
        per_batch = tuple(min(k, max_k) for k in per_batch)
    missing = sorted(set(per_batch) - set(step_times.ks))
    if missing:
        raise SolverError(f"the table uses k {missing}, which were not profiled")
    g = goodput_matrix(step_times, rates, max_batch)
    index = {k: i for i, k in enumerate(step_times.ks)}
    columns = np.arange(max_batch)
    chosen = g[[index[k] for k in per_batch], columns]
    best = np.argmax(g, axis=0)
    return Evaluation(
        per_batch_k=per_batch,
        goodput=tuple(float(v) for v in chosen),
        best_fixed_k=tuple(step_times.ks[int(i)] for i in best),
        best_fixed_goodput=tuple(float(v) for v in g[best, columns]),
    )


def predicted_gain(
    step_times: StepTimes,
    rates: Sequence[float],
    old: Sequence[Range],
    new: Sequence[Range],
    load_weights: Mapping[int, float],
    *,
    max_k: int | None = None,
) -> float:
    """Relative goodput change (new / old - 1) under the load distribution."""
    max_batch = max(load_weights)
    old_g = evaluate_table(step_times, rates, old, max_batch=max_batch, max_k=max_k)
    new_g = evaluate_table(step_times, rates, new, max_batch=max_batch, max_k=max_k)
    return new_g.mean_goodput(load_weights) / old_g.mean_goodput(load_weights) - 1.0
