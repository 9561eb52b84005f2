"""Whether to push a new table, pure: build from the step-time estimate T_hat (the profile
corrected by live steps) and a_hat, restricted to the replica's allowed k, and push only when
the predicted goodput over the recent load improves by more than ``min_gain`` (no flapping), or
when the replica restarted and lost our table."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tabletune.admin.protocol import TableView
from tabletune.daemon.oversold import StoodOn
from tabletune.daemon.settings import DecisionSettings
from tabletune.daemon.step_time import MEASURED_STEPS
from tabletune.schemas.table import Range, TableError, dense_lookup, normalize_ranges
from tabletune.solver import (
    Solution,
    SolverError,
    StepTimes,
    TableProblem,
    predicted_gain,
    solve,
)
from tabletune.step_cells import cell_of


@dataclass(frozen=True)
class Decision:
    """The table the daemon wants and why it will (or will not) push it."""

    push: bool
    reason: str
    new: tuple[Range, ...] | None = None
    current: tuple[Range, ...] | None = None
    gain: float | None = None  # predicted relative goodput change over the recent load
    # Where the load runs, a k better by more than the stickiness was not taken because the
    # estimate's noise hid the gain: more evidence may clear it without moving the estimate.
    held_back: bool = False
    # A k put in to be measured on its own run (daemon.trial): (k, batch size it was tried at).
    trial: tuple[int, int] | None = None
    # A push putting a k in at the load's heaviest batch size where it has not run: that k,
    # the batch size and its T_hat there (daemon.oversold holds it to its run if slower); the
    # push's time is set once it is made.
    stood_on: StoodOn | None = None

    @property
    def edges_moved(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        old = tuple(start for start, _, _ in (self.current or ())[1:])
        new = tuple(start for start, _, _ in (self.new or ())[1:])
        return old, new


@dataclass(frozen=True)
class Estimates:
    """What a decision is made from: step times (T_hat on a dense grid, or the profile), their
    relative uncertainty (rows follow ``step_times.ks``, columns B-1; None = exact), a_hat,
    and where T_hat of a k rests on other k's live steps alone (same layout; None: nowhere).
    ``own_steps`` and ``run_steps`` (same layout; None: no live step time): each k's live steps
    at the batch cell since its traffic last changed, all of them and those it ran as the
    cell's main k (not in bursts)."""

    step_times: StepTimes
    rates: tuple[float, ...]
    relative_sigma: np.ndarray | None = None
    unproven: np.ndarray | None = None
    own_steps: np.ndarray | None = None
    run_steps: np.ndarray | None = None


# The relative uncertainty given to an unproven k where it would replace the running k: no
# gain clears a noise bar of 0.1 or more standard errors.
UNPROVEN_SIGMA = 10.0


def decide(
    *,
    estimates: Estimates,
    view: TableView,
    load_weights: Mapping[int, float],
    settings: DecisionSettings,
    min_width: int = 1,
    force: bool = False,
    before_trial: Sequence[Range] | None = None,
    recently_tried: Collection[tuple[int, int]] = (),
) -> Decision:
    """The table to run on this replica; ``force`` skips the gain threshold (restart).
    ``before_trial``: a trial runs, and this is the table it replaced. The trial's k must then
    win as any challenger would, against that table as the running one, and whatever the
    solution is gets pushed (the trial's table is not the baseline it would hold on to).

    The running table is the baseline: a batch size keeps its k unless another is better by
    more than the estimate's uncertainty (``confidence_z`` standard errors), and no range is
    narrower than ``min_width``. An ``unproven`` k (since the traffic there changed, its
    estimate leans on other k's live steps more than on its own) does not replace the running
    k: what the other k show under the new traffic can be far from what it shows, and the
    neighbour bursts measure it first. With trials on (``settings.trials``), a k that only
    bursts measured at the load's batch cell (fewer than ``trial_steps`` steps run as the
    cell's main k) does not replace the running k there either: bursts read a k 0.71-1.53x
    what it runs at (bench/results/burst_vs_run_h200.json), so it is tried on a run of its own
    first (daemon.trial), and kept only if that run wins. A k ``recently_tried`` there (k, the
    cell's first batch size), which no trial may take again yet, is judged on its bursts as
    before (a shift of traffic since may have made it the right one)."""
    step_times, rates = estimates.step_times, estimates.rates
    if not view.dynamic or view.table is None:
        return Decision(push=False, reason="the replica runs a static k: no table to set")
    allowed = sorted(set(view.allowed_k) & set(step_times.ks))
    if not allowed:
        return Decision(
            push=False,
            reason=f"no allowed k {view.allowed_k} was profiled (profiled: {list(step_times.ks)})",
        )
    max_batch = min(view.max_num_seqs, step_times.max_batch)
    try:
        current = normalize_ranges(view.table)
    except TableError as error:
        current = None
        current_problem = str(error)
    incumbent = before_trial if before_trial is not None else current
    baseline = _baseline(incumbent, max_batch, view.num_speculative_tokens)
    bursts_only = (
        _bursts_only(estimates, load_weights, max_batch, settings.trial_steps, recently_tried)
        if settings.trials
        else None
    )
    thin = _thinly_measured(estimates, baseline, max_batch, settings.challenger_min_steps)
    sigma = _unproven_barred(estimates, baseline, max_batch, bursts_only, thin)
    try:
        solution = solve(
            TableProblem(
                step_times=step_times,
                rates=rates,
                allowed_k=allowed,
                max_batch=max_batch,
                stickiness=settings.stickiness,
                uncertainty=sigma,
                confidence=settings.confidence_z,
                baseline=baseline,
                min_width=min_width,
            )
        )
    except SolverError as error:
        return Decision(push=False, reason=f"solver refused: {error}")
    new = solution.ranges
    if current is None:
        return Decision(push=True, reason=f"current table unreadable ({current_problem})", new=new)
    weights = {min(max(1, b), max_batch): 0.0 for b in load_weights}
    for b, w in load_weights.items():
        weights[min(max(1, b), max_batch)] += w
    if sum(weights.values()) <= 0:
        weights = {b: 1.0 for b in range(1, max_batch + 1)}  # no load seen: every load alike
    held = _held_back(solution, weights, settings.stickiness)
    if _same_lookup(current, new, max_batch, view.num_speculative_tokens):
        return Decision(
            push=False,
            reason="the table is already right" + (" (a gain within the noise)" if held else ""),
            new=new,
            current=current,
            held_back=held,
        )
    try:
        gain = predicted_gain(
            step_times, rates, current, new, weights, max_k=view.num_speculative_tokens
        )
    except SolverError:
        # The running table uses a k the profile lacks: it cannot be scored, ours can.
        return Decision(
            push=True, reason="current table uses unprofiled k", new=new, current=current
        )
    if before_trial is not None:
        reason = "trial ended"
    elif force:
        reason = "replica restarted: restore the table"
    elif gain > settings.min_gain:
        reason = f"predicted gain {gain:+.2%}"
    else:
        reason = ""
    if reason:
        stood = _stood_on(estimates, current, new, weights, max_batch, view.num_speculative_tokens)
        return Decision(
            push=True, reason=reason, new=new, current=current, gain=gain, stood_on=stood
        )
    return Decision(
        push=False,
        reason=f"predicted gain {gain:+.2%} is within the {settings.min_gain:.1%} threshold",
        new=new,
        current=current,
        gain=gain,
        held_back=held,
    )


def _held_back(solution: Solution, weights: Mapping[int, float], stickiness: float) -> bool:
    """At a batch size the load runs at, the best k beats the chosen one by more than the
    stickiness: only the noise bar (or a narrow range merged away) kept it out."""
    return any(
        solution.best_goodput[b - 1] > solution.goodput[b - 1] * (1.0 + stickiness)
        for b, w in weights.items()
        if w > 0
    )


def loaded_cell(load_weights: Mapping[int, float], max_batch: int) -> tuple[int, int, int] | None:
    """The heaviest loaded batch size (clipped to 1..max_batch) and its batch cell cut at
    ``max_batch``, as (batch, low, high); None without load."""
    weights = {b: w for b, w in load_weights.items() if w > 0}
    if not weights:
        return None
    batch = min(max(1, max(weights, key=lambda b: weights[b])), max_batch)
    low, high = cell_of(batch)
    return batch, low, min(high, max_batch)


def _stood_on(
    estimates: Estimates,
    current: Sequence[Range],
    new: Sequence[Range],
    weights: Mapping[int, float],
    max_batch: int,
    big_k: int,
) -> StoodOn | None:
    """The k ``new`` puts in at the heaviest loaded batch size where it has not run
    ``MEASURED_STEPS`` steps as its cell's main k, with its T_hat there; None otherwise (the k
    stays, has run there, or no run counts are known)."""
    cell = loaded_cell(weights, max_batch)
    if cell is None or estimates.run_steps is None:
        return None
    batch = cell[0]
    k = dense_lookup(new, max_batch, big_k)[batch]
    ks = estimates.step_times.ks
    if k == dense_lookup(current, max_batch, big_k)[batch] or k not in ks:
        return None
    if estimates.run_steps[ks.index(k), batch - 1] >= MEASURED_STEPS:
        return None
    return StoodOn(k, batch, float(estimates.step_times.at(batch, k)))


def _bursts_only(
    estimates: Estimates,
    load_weights: Mapping[int, float],
    max_batch: int,
    trial_steps: float,
    recently_tried: Collection[tuple[int, int]],
) -> np.ndarray | None:
    """Rows ks, columns B-1 up to ``max_batch``: over the load's batch cell, the k that bursts
    measured (steps of their own) but that have not run ``trial_steps`` steps as its main k,
    other than those ``recently_tried`` there."""
    own, ran = estimates.own_steps, estimates.run_steps
    cell = loaded_cell(load_weights, max_batch)
    if own is None or ran is None or cell is None:
        return None
    _, low, high = cell
    mask = np.zeros((len(estimates.step_times.ks), max_batch), dtype=bool)
    span = slice(low - 1, high)
    mask[:, span] = (own[:, span] > ran[:, span]) & (ran[:, span] < trial_steps)
    for row, k in enumerate(estimates.step_times.ks):
        if (k, low) in recently_tried:
            mask[row] = False
    return mask


def _thinly_measured(
    estimates: Estimates, baseline: Sequence[int] | None, max_batch: int, min_steps: float
) -> np.ndarray | None:
    """Rows ks, columns B-1 up to ``max_batch``: k has live steps of its own at B's cell, but
    fewer than ``min_steps`` (``DECISION__CHALLENGER_MIN_STEPS``; 0: none), where the running
    table's k there has that many. A few burst steps are not a measurement: on the H200 at
    decode-heavy B≈254 k=1's steps run on the CUDA graph (16 ms) or, with a prompt riding
    along, off it (55-65 ms), and right after a shift check 3 of them, none with a prompt, put
    k=1 at 17 ms; it was pushed on a predicted +59 % and ran at twice that (docs/results.md,
    "At 1cd9e3d"). Off by default: where bursts undersell a k, the emulator's, a push on a few
    steps that happened to read it fast was what brought the right k in (docs/daemon.md)."""
    own = estimates.own_steps
    if own is None or baseline is None or min_steps <= 0:
        return None
    own = own[:, :max_batch]
    rows = {k: row for row, k in enumerate(estimates.step_times.ks)}
    running = np.array(
        [own[rows[k], b] if k in rows else 0.0 for b, k in enumerate(baseline)], dtype=float
    )
    return (own > 0) & (own < min_steps) & (running >= min_steps)[None, :]


def _unproven_barred(
    estimates: Estimates,
    baseline: Sequence[int] | None,
    max_batch: int,
    bursts_only: np.ndarray | None = None,
    thin: np.ndarray | None = None,
) -> np.ndarray | None:
    """The relative uncertainty over B = 1..max_batch, ``UNPROVEN_SIGMA`` where an unproven
    k, one only bursts measured (``bursts_only``), or one measured thinly (``thin``) would
    replace the running table's k."""
    sigma = estimates.relative_sigma
    sigma = None if sigma is None else sigma[:, :max_batch]
    unproven = estimates.unproven
    masks = [m for m in (None if unproven is None else unproven[:, :max_batch], bursts_only,
                         thin) if m is not None]  # fmt: skip
    if baseline is None or not masks:
        return sigma
    ks = np.asarray(estimates.step_times.ks)[:, None]
    barred = np.logical_or.reduce(masks) & (ks != np.asarray(baseline)[None, :])
    if not barred.any():
        return sigma
    base = np.zeros(barred.shape) if sigma is None else sigma
    return np.where(barred, UNPROVEN_SIGMA, base)


def _baseline(
    current: Sequence[Range] | None, max_batch: int, big_k: int
) -> tuple[int, ...] | None:
    """The running table's k for B = 1..max_batch (None when it cannot be read)."""
    if current is None:
        return None
    return tuple(dense_lookup(current, max_batch, big_k)[1:])


def _same_lookup(a: Sequence[Range], b: Sequence[Range], max_batch: int, big_k: int) -> bool:
    return dense_lookup(a, max_batch, big_k) == dense_lookup(b, max_batch, big_k)
