"""Trials, pure: when only neighbour bursts speak for a k that could beat the table's k where the
load runs, put that k in for the load's batch cell so that it is judged on a run of its own.

A burst is three timed steps every 32, so a k the table does not run is known from a few
draws of a step time that, under users' traffic, spreads by half to two thirds of its mean; on
the H200 such an estimate stood 36 % over what the k ran at as a fixed arm, and the daemon
kept a k 7 % worse (docs/results.md, "The miss at decode-heavy B≈127"). A run gives a k
hundreds of steps a cycle.

At the heaviest loaded batch size b (cell c), a k is tried when its goodput, its T_hat taken
``z`` standard errors faster, beats the table's k there by more than ``min_gain`` (1.5: the
H200 bursts' estimate of k=2 above was 1.1-1.3 standard errors short of winning, so one would
not have tried it; on the emulator's near-ties one did about as well and two tried k=0 and k=1
on thin evidence: docs/daemon.md); when it has
burst steps of its own there (``MEASURED_STEPS``: without them the bursts come first); and when
it has not run as the cell's main k for ``trial_steps`` steps since the traffic there changed
(so a k tried is not tried again until then), nor in the ``retry_s`` after a trial of it at c
(``recently_tried``): on the H200 the shift check, which also clears those step counts, fired
in steady traffic every 20-30 s and the same two k were tried twice each within a minute
(docs/results.md, "Trials on the H200"). The trial sets k over c alone. Once it has run
``trial_steps`` steps there (or ``max_s`` passed: the load left, the table was changed), the
next decision settles it (``settle_due``): the trial's k must
beat the table it replaced as any challenger must beat the running k (beyond the noise), or
that table comes back. A trial does not hold on to its k through a tie.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np

from tabletune.admin.protocol import TableView
from tabletune.daemon.decide import Decision, Estimates, loaded_cell
from tabletune.daemon.step_time import MEASURED_STEPS
from tabletune.schemas.table import Range, TableError, normalize_ranges
from tabletune.solver import SolverError, dense_lookup, ranges_from_lookup, tau


@dataclass(frozen=True)
class Trial:
    """A trial in force: its k, the batch size it was tried at, the table it replaced, when."""

    k: int
    batch: int
    before: tuple[Range, ...]
    started_at: float


def settle_due(
    trial: Trial,
    estimates: Estimates,
    view: TableView,
    *,
    now: float,
    trial_steps: float,
    max_s: float,
) -> bool:
    """Whether the trial is to be judged: its k ran ``trial_steps`` steps of its own, or it can
    no longer (the table no longer runs it there, the load left) and ``max_s`` bounds the wait."""
    ran = estimates.run_steps
    rows = {k: i for i, k in enumerate(estimates.step_times.ks)}
    if ran is None or trial.k not in rows or trial.batch > ran.shape[1]:
        return True  # nothing can tell it apart: settle at once
    try:
        table = normalize_ranges(view.table)
        running = dense_lookup(table, trial.batch, view.num_speculative_tokens)[trial.batch]
    except (TableError, SolverError):
        return True  # no table to read it from: settle
    return (
        running != trial.k
        or now - trial.started_at >= max_s
        or bool(ran[rows[trial.k], trial.batch - 1] >= trial_steps)
    )


def propose_trial(
    *,
    estimates: Estimates,
    view: TableView,
    load_weights: Mapping[int, float],
    z: float,
    min_gain: float,
    trial_steps: float,
    min_width: int = 1,
    recently_tried: Collection[tuple[int, int]] = (),
) -> Decision | None:
    """The trial to push, or None (nothing to try, or no room for it). ``recently_tried``:
    (k, the first batch size of its cell) tried within the retry window, not tried again."""
    own, ran = estimates.own_steps, estimates.run_steps
    if own is None or ran is None or not view.dynamic or view.table is None:
        return None
    try:
        current = normalize_ranges(view.table)
    except TableError:
        return None  # an unreadable table is the decision's to replace, not a trial's
    step_times, rates = estimates.step_times, estimates.rates
    max_batch = min(view.max_num_seqs, step_times.max_batch)
    cell = loaded_cell(load_weights, max_batch)
    if cell is None:
        return None
    batch, low, high = cell
    if high - low + 1 < min_width:
        return None
    lookup = dense_lookup(current, max_batch, view.num_speculative_tokens)
    rows = {k: i for i, k in enumerate(step_times.ks)}
    running = lookup[batch]
    if running not in rows:
        return None
    bar = tau(rates, running) / step_times.at(batch, running) * (1.0 + min_gain)
    sigma = np.zeros_like(own) if estimates.relative_sigma is None else estimates.relative_sigma
    best: tuple[float, int] | None = None
    for k in sorted(set(view.allowed_k) & set(rows) - {running}):
        i = rows[k]
        if own[i, batch - 1] < MEASURED_STEPS or ran[i, batch - 1] >= trial_steps:
            continue
        if (k, low) in recently_tried:
            continue
        hopeful_ms = step_times.at(batch, k) * max(1.0 - z * float(sigma[i, batch - 1]), 1e-9)
        promise = tau(rates, k) / hopeful_ms
        if promise > bar and (best is None or promise > best[0]):
            best = (promise, k)
    if best is None:
        return None
    k = best[1]
    lookup[low : high + 1] = [k] * (high - low + 1)
    return Decision(
        push=True,
        reason=(
            f"trial of k={k} at {low}-{high}: bursts alone measured it, within {z:g} standard "
            f"errors of beating k={running}"
        ),
        new=ranges_from_lookup(lookup),
        current=current,
        trial=(k, batch),
    )
