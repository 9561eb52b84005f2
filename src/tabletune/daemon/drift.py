"""Drift checks, pure: live acceptance vs the prior, live step times vs the profile's T.

Step times drift when serving differs from what the profile timed (prefill riding along,
graph misses past the capture limit, long contexts, a drafter whose work grows with
acceptance); the table is then built on T_hat rather than the profile, and an operator should
know the profile no longer describes this replica. Each cell of the last interval compares its
live mean with the profile at the cell's own mean batch size, so a replica running exactly at
the profile shows a ratio of one (up to noise), whatever its batch sizes, and a change shows
within one cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tabletune.daemon.step_time import StepTimeLayout
from tabletune.step_cells import StepCells


@dataclass(frozen=True)
class CellDrift:
    k: int
    cell: tuple[int, int]
    steps: float
    ratio: float  # live mean step time / profile T at the cell's live mean batch size
    mean_tokens: float


def step_drifts(layout: StepTimeLayout, cells: StepCells, *, min_steps: float) -> list[CellDrift]:
    """Every cell of one interval with enough steps, most off the profile first."""
    out: list[CellDrift] = []
    for (k, low, high), totals in cells.items():
        if totals.steps < min_steps or layout.index(k, low, high) is None:
            continue
        row = layout.ks.index(k)
        prior_s = layout.prior_at(np.full((len(layout.ks), 1), totals.mean_batch))[row, 0]
        out.append(
            CellDrift(k, (low, high), totals.steps, totals.mean_s / prior_s, totals.mean_tokens)
        )
    return sorted(out, key=lambda d: abs(d.ratio - 1.0), reverse=True)


def acceptance_gap(rates: Sequence[float], prior: Sequence[float]) -> tuple[int, float]:
    """(position 1-based, a_hat_i - a_prior_i) where the gap is largest in size."""
    gaps = [r - p for r, p in zip(rates, prior, strict=False)]
    index = max(range(len(gaps)), key=lambda i: abs(gaps[i]))
    return index + 1, gaps[index]
