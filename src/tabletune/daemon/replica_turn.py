"""A replica's turn in the cycle: its step-time estimate and checks, its table read when ours
may be out of date, its plan (pure, ``daemon.plan``), and its effects sent (``daemon.apply``)
alongside the other replicas' on ``daemon.replica_io``; their answers are recorded as they come
(``daemon.outcomes``), until the cycle's deadline (``await_admin``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import numpy as np
import structlog

from tabletune.admin.protocol import TableView
from tabletune.daemon.apply import AdminApi, apply_effects
from tabletune.daemon.checks import Checks
from tabletune.daemon.deadlines import try_fits
from tabletune.daemon.decide import Decision, Estimates
from tabletune.daemon.estimation import UnitEstimator
from tabletune.daemon.explore import (
    Exploration,
    priced_spacing,
    replica_acceptance_spacing,
    replica_exploration,
    sparse_bursts,
)
from tabletune.daemon.guard import goodput_sample, view_ranges
from tabletune.daemon.metrics import DaemonMetrics
from tabletune.daemon.observation import Observation
from tabletune.daemon.outcomes import Outcomes
from tabletune.daemon.oversold import held_to_runs, learned
from tabletune.daemon.plan import (
    PlanInputs,
    ReplicaPlan,
    estimates_moved,
    load_moved,
    mean_load,
    plan_replica,
    rollback_hold_until,
)
from tabletune.daemon.replica_io import ReplicaIo, Round
from tabletune.daemon.retry import with_retries
from tabletune.daemon.runtime import CycleReport, ReplicaRuntime
from tabletune.daemon.settings import DaemonSettings
from tabletune.daemon.step_time import StepTimeEstimate
from tabletune.errors import TableTuneError

log = structlog.get_logger("tabletune.daemon")

T = TypeVar("T")


@dataclass(frozen=True)
class Turn:
    """One replica's part of one cycle: what it observed and what it is decided with."""

    rt: ReplicaRuntime
    obs: Observation
    unit: UnitEstimator
    rebuilt: bool  # the unit's a_hat was rebuilt this cycle
    now: float
    report: CycleReport
    admin: Round
    client: AdminApi
    estimate: StepTimeEstimate


class ReplicaTurn:
    """Runs replicas' turns for the controller, which owns the replicas and the cycle."""

    def __init__(
        self,
        *,
        settings: DaemonSettings,
        metrics: DaemonMetrics,
        checks: Checks,
        outcomes: Outcomes,
        io: ReplicaIo,
        admin_for: Callable[[str], AdminApi],
        replicas: dict[str, ReplicaRuntime],
        stop: threading.Event,
        sleep: Callable[[float], None],
        dry_run: bool,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.checks = checks
        self.outcomes = outcomes
        self.io = io
        self.admin_for = admin_for
        self.replicas = replicas
        self._stop = stop
        self.sleep = sleep
        self.dry_run = dry_run
        self._params = settings.step_time.blend_params()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(
        self,
        rt: ReplicaRuntime,
        obs: Observation,
        unit: UnitEstimator,
        rebuilt: bool,
        now: float,
        report: CycleReport,
        admin: Round,
    ) -> None:
        rt.loads.add(obs)
        if obs.reset:
            rt.step_time.clear()  # the engine restarted, perhaps with other settings
        self.settings.step_time.feed(rt.step_time, obs.step_cells, now)
        self._end_hold_on_shift(rt, now)
        estimate = self._held_to_runs(
            rt, rt.step_time.estimate(self._params, prior_sigma=rt.pool.relative_sigma), now
        )
        self.checks.step_time(rt, obs.step_cells, now)
        self.checks.profile_setup(rt, now)  # against the last view read (a cycle late at first)
        self.checks.plugin(rt, now)
        turn = Turn(
            rt, obs, unit, rebuilt, now, report, admin, self.admin_for(rt.admin_url), estimate
        )
        self._with_view(turn, then=partial(self._plan_and_apply, turn))

    @staticmethod
    def _end_hold_on_shift(rt: ReplicaRuntime, now: float) -> None:
        until = rollback_hold_until(rt.hold_until, rt.rolled_back_at, rt.step_time.shifted_at)
        if until < rt.hold_until and now < rt.hold_until:
            log.info(
                "rollback hold ended: the traffic shifted",
                replica=rt.replica,
                rolled_back_s_ago=round(now - (rt.rolled_back_at or now), 1),
                hold_left_s=round(rt.hold_until - now),
            )
        rt.hold_until = until

    def _held_to_runs(
        self, rt: ReplicaRuntime, estimate: StepTimeEstimate, now: float
    ) -> StepTimeEstimate:
        """The estimate with each k the replica's runs showed oversold held to its run, after
        reading this cycle's run of a k a push put in (daemon.oversold)."""
        decision = self.settings.decision
        before = dict(rt.oversold)
        rt.stood_on, oversold = learned(
            rt.stood_on,
            rt.oversold,
            estimate,
            now,
            keep_s=decision.oversold_for_s,
            wait_s=decision.trial_max_s,
        )
        if oversold != before:
            rt.set_oversold(oversold)
        for (k, low), (factor, since) in rt.oversold.items():
            if before.get((k, low)) != (factor, since):
                log.info(
                    "estimate oversold a k: held to its run",
                    replica=rt.replica,
                    k=k,
                    cell_from=low,
                    run_over_estimate=round(factor, 3),
                    for_s=decision.oversold_for_s,
                )
        return held_to_runs(estimate, {key: f for key, (f, _) in rt.oversold.items()})

    def _plan_and_apply(self, turn: Turn, view: TableView) -> None:
        """The rest of the replica's cycle once its table is known: plan, then send the
        effects (their outcome is recorded when the answer comes)."""
        rt, now, report = turn.rt, turn.now, turn.report
        # The table that ran during the interval: ours from last cycle, else what we just read.
        sample = goodput_sample(rt.pool, rt.view or view, turn.obs, turn.unit.rates, now)
        if sample is not None:
            rt.history.add(sample)
        restart = turn.obs.reset or (
            rt.record.version is not None and view.version < rt.record.version
        )
        if restart:
            log.warning(
                "replica restarted: counters or table version went back",
                replica=rt.replica,
                version=view.version,
                known=rt.record.version,
            )
            rt.pending = None
            rt.history.clear()
        self._adopt_view(rt, view)
        inputs, ratio = self._plan_inputs(turn, view, restart)
        plan = plan_replica(rt, inputs, settings=self.settings, dry_run=self.dry_run)
        self._log_plan(rt, plan, now)
        if plan.decision is not None:
            self._note_decision(rt, plan.decision, ratio, turn.unit.rates, now, report)
        if not plan.effects:
            return
        effects, call, client = plan.effects, partial(self._call, turn.admin.deadline), turn.client
        self._send(
            turn,
            lambda: apply_effects(rt.replica, effects, view, client, call=call),
            done=lambda applied: self.outcomes.record(rt, applied, now, report),
            failed=lambda error: self.outcomes.push_failed(rt, str(error), now, report),
        )

    def _plan_inputs(
        self, turn: Turn, view: TableView, restart: bool
    ) -> tuple[PlanInputs, np.ndarray]:
        """What the planner sees, and the live/profile step-time ratio it decides on."""
        rt, unit, estimate = turn.rt, turn.unit, turn.estimate
        use_live = self.settings.step_time.enabled
        columns = rt.step_time.layout.cell_of_batch  # each batch size's cell
        ratio = estimate.ratio if use_live else np.ones_like(estimate.ratio)
        step_time_moved, rates_moved = estimates_moved(
            rt, ratio, unit.rates, replan_change=self.settings.decision.replan_change
        )
        exploration = (
            replica_exploration(rt, view, estimate, unit.rates, self.settings) if use_live else None
        )
        inputs = PlanInputs(
            view=view,
            now=turn.now,
            restart=restart,
            estimates=Estimates(
                step_times=estimate.step_times if use_live else rt.pool.step_times,
                rates=unit.rates,
                relative_sigma=estimate.relative_sigma if use_live else rt.pool.relative_sigma,
                unproven=estimate.unproven if use_live else None,
                own_steps=estimate.measured[:, columns] if use_live else None,
                run_steps=estimate.ran[:, columns] if use_live else None,
            ),
            load_weights=rt.loads.weights,
            rates_moved=turn.rebuilt and rates_moved,
            # Before the first rebuild the estimate is the profile's prior: deciding from it at
            # first sight repairs a bad starting table at once (where it runs k=0 the live
            # counts come from exploration alone and the first rebuild takes minutes).
            estimate_ready=unit.rebuilds > 0 or self.settings.decision.first_sight_from_prior,
            step_time_moved=step_time_moved,
            load_moved=load_moved(rt.decided_load, rt.loads.weights),
            explore_ks=None if exploration is None else exploration.ks,
            explore_sparse=self._sparse(rt, exploration, turn.now, rt.hold_until - turn.now),
            explore_sparse_if_held=self._sparse(
                rt, exploration, turn.now, self.settings.guard.cooldown_s
            ),
            exploration_spacing=replica_acceptance_spacing(
                rt,
                view,
                estimate.step_times if use_live else rt.pool.step_times,
                unit.rates,
                self.settings,
            ),
            explore_spacing=0
            if exploration is None
            else priced_spacing(
                exploration,
                burst=self.settings.plugin.neighbour_burst,
                budget=self.settings.plugin.neighbour_cost_budget,
            ),
        )
        return inputs, ratio

    def _sparse(
        self, rt: ReplicaRuntime, exploration: Exploration | None, now: float, hold_left_s: float
    ) -> bool:
        return exploration is not None and sparse_bursts(
            exploration,
            table_stood=self._table_stood(rt, now),
            hold_left_s=hold_left_s,
            recheck_after_s=self.settings.plugin.neighbour_recheck_after_s,
        )

    def _table_stood(self, rt: ReplicaRuntime, now: float) -> bool:
        """The replica's table has stood long enough, since its last push and since this
        daemon first saw it, for re-checks to run sparser."""
        since = max(rt.watched_since, rt.record.pushed_at or rt.watched_since)
        return now - since >= self.settings.plugin.neighbour_recheck_after_s

    @staticmethod
    def _log_plan(rt: ReplicaRuntime, plan: ReplicaPlan, now: float) -> None:
        if plan.verdict is not None and plan.verdict.outcome != "wait":
            rt.pending = None
            if plan.verdict.outcome != "drop":
                log.info(
                    "push guard passed",
                    replica=rt.replica,
                    outcome=plan.verdict.outcome,
                    change=plan.verdict.change,
                    samples=plan.verdict.samples,
                )
        if plan.held:
            log.info(
                "push held after a rollback", replica=rt.replica, for_s=round(rt.hold_until - now)
            )

    def _with_view(self, turn: Turn, *, then: Callable[[TableView], None]) -> None:
        """Read the table only when ours may be out of date: first sight, a restart, a failed
        or refused push, or every refresh_s. Otherwise the view our last call returned stands
        (pushes carry If-Match, so a table changed behind our back still cannot be lost)."""
        rt, now = turn.rt, turn.now
        stale = rt.view is None or now - rt.view_read_at >= self.settings.admin.refresh_s
        if not (stale or turn.obs.reset or rt.needs_decision):
            assert rt.view is not None
            then(rt.view)
            return

        def read(view: TableView) -> None:
            rt.view_read_at = now
            then(view)

        get = partial(
            self._call, turn.admin.deadline, turn.client.get_table, f"GET table {rt.replica}"
        )
        self._send(
            turn,
            get,
            done=read,
            failed=lambda error: self.outcomes.push_failed(
                rt, f"cannot read the table: {error}", now, turn.report
            ),
            after_deadline=False,  # planning it then would run past the cycle's budget
        )

    def _send(
        self,
        turn: Turn,
        action: Callable[[], T],
        *,
        done: Callable[[T], None],
        failed: Callable[[TableTuneError], None],
        after_deadline: bool = True,
    ) -> None:
        """One admin request of the replica, alongside the others' (``await_admin``)."""
        if not turn.admin.submit(
            turn.rt.replica, action, done=done, failed=failed, after_deadline=after_deadline
        ):
            why = "its previous admin call has not ended (the engine does not answer)"
            self.outcomes.push_failed(turn.rt, why, turn.now, turn.report)

    def await_admin(self, admin: Round, now: float, report: CycleReport) -> None:
        """Handle the admin answers as they come, until the cycle's deadline. A replica that has
        not answered for its timeout then failed this cycle; one whose call went out later, or
        never (the daemon was behind), is simply decided again next cycle."""
        left = admin.wait()
        if self.stopping:
            report.abandoned = report.abandoned or bool(left)
            return
        for replica in left.late:
            budget = self.settings.loop.cycle_budget * self.settings.loop.interval_s
            why = f"no answer within the cycle's budget ({budget:.3g} s)"
            self.outcomes.push_failed(self.replicas[replica], why, now, report)
        for replica in left.unjudged:
            self.replicas[replica].needs_decision = True
            report.deferred.append(replica)
        if left.unjudged:
            log.warning("admin calls left for the next cycle", replicas=len(left.unjudged))

    def _adopt_view(self, rt: ReplicaRuntime, view: TableView) -> None:
        if view is rt.view:
            return
        rt.record.version = view.version
        rt.view = view
        current = view_ranges(view)
        if current is not None:
            self.metrics.set_table(rt.replica, current, view.version)

    def _note_decision(
        self,
        rt: ReplicaRuntime,
        decision: Decision,
        ratio: np.ndarray,
        rates: tuple[float, ...],
        now: float,
        report: CycleReport,
    ) -> None:
        report.decisions[rt.replica] = decision
        rt.needs_decision = False
        rt.decided_ratio, rt.decided_rates = ratio, rates
        rt.decided_at, rt.held_back = now, decision.held_back
        if decision.trial is None:  # a decision other than a trial's start settles any trial
            rt.set_trial(None)
        rt.decided_load = mean_load(rt.loads.weights)
        if decision.gain is not None:
            self.metrics.predicted_gain.labels(rt.replica).set(decision.gain)
        if decision.push and self.dry_run:
            log.info(
                "dry run: would push",
                replica=rt.replica,
                reason=decision.reason,
                old=decision.current,
                new=decision.new,
                gain=decision.gain,
            )
        elif not decision.push:
            log.debug("no push", replica=rt.replica, reason=decision.reason)

    def _call(self, deadline: float, action: Callable[[], TableView], what: str) -> TableView:
        """One admin request with the retry schedule, retried only while a try still fits
        before the cycle's deadline and the daemon is not stopping (runs on a worker)."""

        def may_wait(wait_s: float) -> bool:
            now, attempt_s = self.io.monotonic(), self.settings.admin.timeout_s
            fits = try_fits(now, wait_s=wait_s, attempt_s=attempt_s, deadline=deadline)
            return fits and not self.stopping

        return with_retries(
            action,
            what=what,
            backoffs_s=self.settings.admin.retry_backoffs_s,
            sleep=self.sleep,
            may_wait=may_wait,
        )
