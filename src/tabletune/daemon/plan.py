"""What to do about one replica this cycle, pure: the effects to apply, in order.

Given what the daemon remembers (``ReplicaRuntime``) and what the cycle saw (``PlanInputs``),
``plan_replica`` returns plugin settings to set, a rollback the guard asks for, or a table to
push. Nothing here talks to a replica; ``daemon.apply`` executes the effects, last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tabletune.admin.protocol import TableView
from tabletune.daemon.decide import Decision, Estimates, decide
from tabletune.daemon.guard import GoodputSample, PendingCheck, Verdict, judge
from tabletune.daemon.runtime import ReplicaRuntime
from tabletune.daemon.settings import DaemonSettings
from tabletune.daemon.trial import propose_trial, settle_due


@dataclass(frozen=True)
class SetPluginSettings:
    exploration_interval: int
    hysteresis: int
    neighbour_interval: int
    neighbour_burst: int
    neighbour_ks: tuple[int, ...] = ()  # empty: the adjacent k


@dataclass(frozen=True)
class PushTable:
    decision: Decision


@dataclass(frozen=True)
class RollBack:
    pending: PendingCheck
    verdict: Verdict


Effect = SetPluginSettings | PushTable | RollBack


@dataclass(frozen=True)
class PlanInputs:
    """What this cycle knows about the replica, beyond its memory."""

    view: TableView
    now: float
    restart: bool  # counters or the table version went back
    estimates: Estimates
    load_weights: Mapping[int, float]
    rates_moved: bool  # a_hat was rebuilt and moved since the last decision
    estimate_ready: bool  # a_hat may be decided on (rebuilt once, or first sight allowed)
    step_time_moved: bool  # T_hat where the load runs moved since the last decision
    load_moved: bool = False  # the load is elsewhere than where the last decision weighed it
    explore_ks: tuple[int, ...] | None = None  # directed bursts (empty: none); None: adjacent
    explore_sparse: bool = False  # bursts at the re-check interval (explore.sparse_bursts)
    explore_sparse_if_held: bool = False  # the same, were a rollback to start its hold now
    explore_spacing: int = 0  # the fewest steps between bursts their price allows (0: any)
    # the fewest steps between acceptance-exploration steps their price allows (0: any)
    exploration_spacing: int = 0


@dataclass(frozen=True)
class ReplicaPlan:
    effects: tuple[Effect, ...] = ()
    decision: Decision | None = None
    verdict: Verdict | None = None  # the guard's judgement of the last push, when judged
    held: bool = False  # a push was due but a rollback's cooldown holds it


def wanted_settings(
    view: TableView,
    settings: DaemonSettings,
    explore_ks: tuple[int, ...] | None = None,
    sparse: bool = False,
    spacing: int = 0,
    exploration_spacing: int = 0,
) -> SetPluginSettings | None:
    """The plugin settings to set, when the replica's differ from the wanted ones. Directed
    bursts (``explore_ks``) run only at those k, and not at all when there are none; at the
    re-check interval when ``sparse`` (``explore.sparse_bursts``), and at least ``spacing``
    steps apart (their price: ``explore.priced_spacing``). The acceptance exploration's steps
    at least ``exploration_spacing`` apart (``explore.acceptance_spacing``), its interval
    doubled to it (``kept_or_doubled``)."""
    w = settings.plugin
    interval = w.neighbour_interval if explore_ks is None or explore_ks else 0
    if explore_ks and sparse and w.neighbour_recheck_interval:
        interval = w.neighbour_recheck_interval
    if explore_ks and interval:
        interval = doubled_to(interval, spacing)
    exploration = w.exploration_interval
    if exploration:
        exploration = kept_or_doubled(view.exploration_interval, exploration, exploration_spacing)
    wanted = SetPluginSettings(
        exploration, w.hysteresis, interval, w.neighbour_burst, explore_ks or ()
    )
    running = SetPluginSettings(
        view.exploration_interval,
        view.hysteresis,
        view.neighbour_interval,
        view.neighbour_burst,
        tuple(view.neighbour_ks),
    )
    return None if running == wanted else wanted


MAX_NEIGHBOUR_INTERVAL = 1_000_000  # the admin API's bound


def doubled_to(interval: int, spacing: int) -> int:
    """``interval`` doubled until it reaches ``spacing``: few distinct values, so a price that
    drifts cycle by cycle does not reset the plugin's settings each time."""
    while interval < spacing and interval * 2 <= MAX_NEIGHBOUR_INTERVAL:
        interval *= 2
    return interval


def kept_or_doubled(running: int, interval: int, spacing: int) -> int:
    """``interval`` doubled to ``spacing``, or the ``running`` one while it is such a doubling
    at most twice that: a price hovering at a doubling does not flip the setting cycle after
    cycle (at decode-heavy B≈254 on the H200 the acceptance exploration's went 200, 400, 200...
    with a settings PUT each time)."""
    wanted = doubled_to(interval, spacing)
    ratio, rest = divmod(running, interval)
    doubling = rest == 0 and ratio > 0 and ratio & (ratio - 1) == 0
    return running if doubling and wanted <= running <= 2 * wanted else wanted


# a_hat must move by more than this (absolute, at some position) to call for a new decision:
# near-ties aside, a change that small cannot move a table past the gain threshold.
RATES_REPLAN = 0.005


def estimates_moved(
    rt: ReplicaRuntime, ratio: np.ndarray, rates: Sequence[float], *, replan_change: float
) -> tuple[bool, bool]:
    """(T_hat moved, a_hat moved) since the replica's last decision."""
    ratio_moved = rt.decided_ratio is not None and bool(
        np.max(np.abs(ratio / rt.decided_ratio - 1.0)) > replan_change
    )
    rates_moved = rt.decided_rates is None or any(
        abs(a - b) > RATES_REPLAN for a, b in zip(rates, rt.decided_rates, strict=False)
    )
    return ratio_moved, rates_moved


# The load must move by more than this many batch sizes, or this share, to call for a new
# decision: one 8-wide cell of the step timer, or a tenth of a large load.
LOAD_REPLAN_BATCHES = 8
LOAD_REPLAN_SHARE = 0.1


def mean_load(weights: Mapping[int, float]) -> float | None:
    """The load-weighted mean batch size (None: no load seen)."""
    total = sum(weights.values())
    return sum(b * w for b, w in weights.items()) / total if total > 0 else None


def load_moved(decided_load: float | None, weights: Mapping[int, float]) -> bool:
    """Whether the load left the batch sizes the last decision weighed its gain over."""
    now = mean_load(weights)
    if now is None:
        return False
    if decided_load is None:
        return True
    return abs(now - decided_load) > max(LOAD_REPLAN_BATCHES, LOAD_REPLAN_SHARE * decided_load)


def same_traffic(
    before: Sequence[GoodputSample], shifted_at: float | None
) -> tuple[GoodputSample, ...]:
    """The samples before a push taken since the traffic last shifted: goodput against the
    profile's model moves with the traffic's shape, so a push must not be judged against
    samples of other traffic (after a change of shape every table looks slower)."""
    return tuple(s for s in before if shifted_at is None or s.at > shifted_at)


def rollback_hold_until(
    hold_until: float, rolled_back_at: float | None, shifted_at: float | None
) -> float:
    """When a rollback's hold on pushes ends: at its cooldown's end, or when the traffic
    shifts after it if sooner. The guard judged the table it rolled back on the traffic its
    samples saw (``same_traffic``); on new traffic that judgement says nothing, and waiting
    out the cooldown (15 minutes by default) would leave the old traffic's table in."""
    if rolled_back_at is None or shifted_at is None or shifted_at <= rolled_back_at:
        return hold_until
    return min(hold_until, shifted_at)


def min_range_width(settings: DaemonSettings) -> int:
    """No range narrower than the plugin's hysteresis band (a load inside a narrower range
    would keep the k of a neighbour and never run it)."""
    return 2 * settings.plugin.hysteresis + 1


def plan_replica(
    rt: ReplicaRuntime, inputs: PlanInputs, *, settings: DaemonSettings, dry_run: bool
) -> ReplicaPlan:
    verdict: Verdict | None = None
    rollback: RollBack | None = None
    if rt.pending is not None and not inputs.restart:
        verdict = judge(
            same_traffic(rt.pending.before, rt.step_time.shifted_at),
            rt.history.since(rt.pending.pushed_at),
            elapsed_s=inputs.now - rt.pending.pushed_at,
            settings=settings.guard,
        )
        if verdict.outcome == "drop" and not dry_run:
            rollback = RollBack(rt.pending, verdict)
    effects: list[Effect] = []
    change = wanted_settings(
        inputs.view,
        settings,
        inputs.explore_ks,
        # A rollback starts its hold this cycle: its bursts are spaced for it already.
        inputs.explore_sparse_if_held if rollback else inputs.explore_sparse,
        inputs.explore_spacing,
        inputs.exploration_spacing,
    )
    if not dry_run and change is not None:
        effects.append(change)
    if rollback is not None:
        return ReplicaPlan((*effects, rollback), verdict=verdict)
    recheck = rt.held_back and inputs.now - rt.decided_at >= settings.decision.recheck_held_back_s
    trial = None if inputs.restart else rt.trial
    if trial is not None and not settle_due(
        trial,
        inputs.estimates,
        inputs.view,
        now=inputs.now,
        trial_steps=settings.decision.trial_steps,
        max_s=settings.decision.trial_max_s,
    ):
        return ReplicaPlan(tuple(effects), verdict=verdict)  # the trial runs on
    due = (
        trial is not None
        or inputs.rates_moved
        or (
            inputs.estimate_ready
            and (
                inputs.restart
                or rt.needs_decision
                or inputs.step_time_moved
                or inputs.load_moved
                or recheck
            )
        )
    )
    if not due:
        return ReplicaPlan(tuple(effects), verdict=verdict)
    if inputs.now < rt.hold_until:
        return ReplicaPlan(tuple(effects), verdict=verdict, held=True)
    recently_tried = {
        key for key, at in rt.tried_at.items() if inputs.now - at < settings.decision.trial_retry_s
    }
    decision = decide(
        estimates=inputs.estimates,
        view=inputs.view,
        load_weights=inputs.load_weights,
        settings=settings.decision,
        min_width=min_range_width(settings),
        force=inputs.restart,
        before_trial=None if trial is None else trial.before,
        recently_tried=recently_tried,
    )
    if not decision.push and trial is None and settings.decision.trials:
        decision = (
            propose_trial(
                estimates=inputs.estimates,
                view=inputs.view,
                load_weights=inputs.load_weights,
                z=settings.decision.trial_z,
                min_gain=settings.decision.min_gain,
                trial_steps=settings.decision.trial_steps,
                min_width=min_range_width(settings),
                recently_tried=recently_tried,
            )
            or decision
        )
    if decision.push and decision.new is not None and not dry_run:
        effects.append(PushTable(decision))
    return ReplicaPlan(tuple(effects), decision=decision, verdict=verdict)
