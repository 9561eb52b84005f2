"""The goodput model: tau(k), G(B, k) = B * tau(k) / T(B, k), and T between measured points.

T is piecewise-linear between measured batch sizes of the same k, never a global fit: real
profiles have jumps (cells without a captured CUDA graph) that a fit would smooth away.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tabletune.solver.errors import SolverError


def check_rates(rates: Sequence[float]) -> tuple[float, ...]:
    """a_1..a_K, each in [0, 1]."""
    values = tuple(float(a) for a in rates)
    for i, a in enumerate(values, start=1):
        if not 0.0 <= a <= 1.0:
            raise SolverError(f"a_{i}={a} is outside [0, 1]")
    return values


def tau(rates: Sequence[float], k: int) -> float:
    """Expected tokens kept per request per step with k guesses: 1 + sum_{i<=k} a_i."""
    if k < 0 or k > len(rates):
        raise SolverError(f"k={k} outside 0..{len(rates)} (rates known up to K={len(rates)})")
    return 1.0 + float(sum(rates[:k]))


def goodput(batch_size: int, k: int, step_ms: float, rates: Sequence[float]) -> float:
    """Kept tokens per millisecond at batch size B with k guesses and step time T (ms)."""
    if step_ms <= 0:
        raise SolverError(f"step time must be positive, got {step_ms}")
    return batch_size * tau(rates, k) / step_ms


@dataclass(frozen=True)
class StepTimes:
    """Measured T(B, k) in ms on a batch grid, for each profiled k (rows follow ``ks``)."""

    grid: tuple[int, ...]
    ks: tuple[int, ...]
    ms: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        ms = np.asarray(self.ms, dtype=float)
        if ms.shape != (len(self.ks), len(self.grid)):
            raise SolverError(
                f"step-time matrix shape {ms.shape} != (len(ks), len(grid)) = "
                f"({len(self.ks)}, {len(self.grid)})"
            )
        if not self.grid or list(self.grid) != sorted(set(self.grid)) or self.grid[0] < 1:
            raise SolverError("grid must be strictly increasing positive batch sizes")
        if not self.ks or list(self.ks) != sorted(set(self.ks)) or self.ks[0] < 0:
            raise SolverError("ks must be strictly increasing non-negative draft lengths")
        if not np.all(np.isfinite(ms)) or np.any(ms <= 0):
            raise SolverError("every step time must be a positive finite number")
        ms.setflags(write=False)
        object.__setattr__(self, "ms", ms)

    @property
    def max_batch(self) -> int:
        return self.grid[-1]

    def row(self, k: int) -> np.ndarray:
        try:
            row: np.ndarray = self.ms[self.ks.index(k)]
            return row
        except ValueError:
            raise SolverError(f"k={k} was not profiled (profiled: {list(self.ks)})") from None

    def dense(self, max_batch: int) -> np.ndarray:
        """T for B = 1..max_batch (columns), each k (rows), interpolated between grid points.

        Below the first grid point T is held at the first measurement; beyond the last one the
        model has no data, so asking for it is an error rather than a guess.
        """
        return interpolate_rows(self.grid, self.ms, max_batch)

    def at(self, batch_size: int, k: int) -> float:
        if batch_size < 1 or batch_size > self.max_batch:
            raise SolverError(f"B={batch_size} outside the profiled 1..{self.max_batch}")
        return float(np.interp(batch_size, np.asarray(self.grid, dtype=float), self.row(k)))


def interpolate_rows(grid: Sequence[int], rows: np.ndarray, max_batch: int) -> np.ndarray:
    """Each row of values on ``grid`` at B = 1..max_batch, piecewise-linear between grid points
    and held below the first; beyond the last grid point there is no data, so that is an error.

    T and anything measured alongside it per cell (its uncertainty) go dense the same way.
    """
    if max_batch < 1:
        raise SolverError("max_batch must be >= 1")
    if max_batch > grid[-1]:
        raise SolverError(f"max_batch={max_batch} is beyond the profiled grid (up to {grid[-1]})")
    values = np.asarray(rows, dtype=float)
    if len(grid) >= max_batch and grid[max_batch - 1] == max_batch:  # dense 1..max_batch already
        return values[:, :max_batch].copy()
    batch = np.arange(1, max_batch + 1, dtype=float)
    points = np.asarray(grid, dtype=float)
    return np.vstack([np.interp(batch, points, row) for row in values])


def goodput_matrix(step_times: StepTimes, rates: Sequence[float], max_batch: int) -> np.ndarray:
    """G[k_index, B-1] in tokens/ms for every profiled k (rows follow ``step_times.ks``)."""
    rates = check_rates(rates)
    if step_times.ks[-1] > len(rates):
        raise SolverError(
            f"acceptance known up to K={len(rates)} but k={step_times.ks[-1]} was profiled"
        )
    t = step_times.dense(max_batch)
    batch = np.arange(1, max_batch + 1, dtype=float)
    taus = np.array([tau(rates, k) for k in step_times.ks])
    result: np.ndarray = batch[None, :] * taus[:, None] / t
    return result
