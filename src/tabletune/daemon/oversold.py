"""A k its estimate oversold, pure: where a push put a k in on an estimate its own run then
read slower, its later estimates there are held to that run until it runs there again.

A push puts k in at the load's heaviest batch size on T_hat there (``StoodOn``), often from
neighbour bursts alone. Once k has run ``MEASURED_STEPS`` steps there as the cell's main k,
its T_hat stands on that run; the run over what the push stood on (``run_over_estimate``),
when above 1, is how far the estimate oversold it. While k no longer runs there (fewer run
steps than that since the cell's traffic last changed) its T_hat at that cell is scaled by it
(``held_to_runs``), for ``DECISION__OVERSOLD_FOR_S`` after the run: the traffic-shift check,
which clears what a cell knew of its runs, fires in steady traffic, and the bursts then sell
the same k again. On the H200 at decode-heavy B≈254 (2026-12-02 08:33 UTC) bursts read k=1
at 0.82 of its run (they take prompts in less often than its run does, and a k=1 step with a
prompt leaves the CUDA graph), the daemon pushed k=1 at 23.5 ms, it ran at 40 ms, the daemon
went back to k=0, the shift check fired 18 s later, and the bursts had k=1 pushed again: three
times in 150 s (docs/results.md, "At dda561f").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from tabletune.daemon.step_time import MEASURED_STEPS, StepTimeEstimate
from tabletune.solver import StepTimes
from tabletune.step_cells import cell_of


@dataclass(frozen=True)
class StoodOn:
    """What a push that put ``k`` in at ``batch`` (where it had not run) stood on: T_hat there
    in the estimate's units, and when the push was made (0 until it is)."""

    k: int
    batch: int
    step_time: float
    at: float = 0.0

    @property
    def cell_low(self) -> int:
        return cell_of(self.batch)[0]


def ran_there(estimate: StepTimeEstimate, k: int, batch: int) -> bool:
    """k has run ``MEASURED_STEPS`` steps at ``batch``'s cell as its main k since the cell's
    traffic last changed."""
    if k not in estimate.ks or cell_of(batch) not in estimate.cells:
        return False
    row, col = estimate.ks.index(k), estimate.cells.index(cell_of(batch))
    return bool(estimate.ran[row, col] >= MEASURED_STEPS)


def run_over_estimate(stood: StoodOn, estimate: StepTimeEstimate) -> float | None:
    """T_hat of the pushed k where it was pushed, now that it has run there, over what the push
    stood on; None until it has run there."""
    if not ran_there(estimate, stood.k, stood.batch) or stood.step_time <= 0:
        return None
    return float(estimate.step_times.at(stood.batch, stood.k)) / stood.step_time


def held_to_runs(
    estimate: StepTimeEstimate, oversold: Mapping[tuple[int, int], float]
) -> StepTimeEstimate:
    """``estimate`` with T_hat of each oversold (k, first batch size of its cell), by how much,
    scaled up over that cell where k has not run since its traffic last changed (its own run
    speaks for it there otherwise)."""
    times = estimate.step_times
    held = [
        (k, low, factor)
        for (k, low), factor in oversold.items()
        if factor > 1.0 and k in estimate.ks and low <= times.max_batch
        and not ran_there(estimate, k, low)
    ]  # fmt: skip
    if not held:  # the common case, every cycle: no copy
        return estimate
    ms = np.array(times.ms, dtype=float)
    grid = np.asarray(times.grid)
    for k, low, factor in held:
        ms[estimate.ks.index(k), (grid >= low) & (grid <= cell_of(low)[1])] *= factor
    return replace(estimate, step_times=StepTimes(grid=times.grid, ks=times.ks, ms=ms))


Oversold = dict[tuple[int, int], tuple[float, float]]  # (k, cell's first B) -> (factor, since)


def learned(
    stood: StoodOn | None,
    oversold: Mapping[tuple[int, int], tuple[float, float]],
    estimate: StepTimeEstimate,
    now: float,
    *,
    keep_s: float,
    wait_s: float,
) -> tuple[StoodOn | None, Oversold]:
    """What a push stood on, still waiting for its k's run (None: nothing waits), and the
    oversold k, after this cycle's estimate: the run read against what the push stood on (the
    estimate then held by any factor already known, so the factors multiply), a wait given up
    after ``wait_s`` without that run, and a factor forgotten ``keep_s`` after it was read."""
    kept: Oversold = {key: v for key, v in oversold.items() if now - v[1] < keep_s}
    if stood is None:
        return None, kept
    factor = run_over_estimate(stood, estimate)
    if factor is None:
        return (stood if now - stood.at <= wait_s else None), kept
    key = (stood.k, stood.cell_low)
    total = factor * (kept[key][0] if key in kept else 1.0)
    kept.pop(key, None)
    if total > 1.0 and keep_s > 0:
        kept[key] = (total, now)
    return None, kept
