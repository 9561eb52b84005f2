"""A replica's turn in the cycle: its step-time estimate and checks, its table read when ours
may be out of date, its plan (pure, ``daemon.plan``), and its effects sent (``daemon.apply``)
alongside the other replicas' on ``daemon.replica_io``; their answers are recorded as they come
(``daemon.outcomes``), until the cycle's deadline (``await_admin``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
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
from tabletune.daemon.explore import replica_exploration
from tabletune.daemon.guard import goodput_sample, view_ranges
from tabletune.daemon.metrics import DaemonMetrics
from tabletune.daemon.observation import Observation
from tabletune.daemon.outcomes import Outcomes
from tabletune.daemon.plan import PlanInputs, estimates_moved, plan_replica
from tabletune.daemon.replica_io import ReplicaIo, Round
from tabletune.daemon.retry import with_retries
from tabletune.daemon.runtime import CycleReport, ReplicaRuntime
from tabletune.daemon.settings import DaemonSettings
from tabletune.daemon.step_time import StepTimeEstimate, StepTimeParams
from tabletune.errors import TableTuneError

log = structlog.get_logger("tabletune.daemon")

T = TypeVar("T")


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
        self._params = StepTimeParams(**settings.step_time.model_dump(exclude={"enabled", "shift"}))

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
        step_time = self.settings.step_time
        rt.step_time.add(
            obs.step_cells, now, half_life_s=step_time.half_life_s, shift=step_time.shift
        )
        estimate = rt.step_time.estimate(self._params, prior_sigma=rt.pool.relative_sigma)
        self.checks.step_time(rt, obs.step_cells, now)
        client = self.admin_for(rt.admin_url)
        then = partial(
            self._plan_and_apply, rt, obs, unit, rebuilt, now, report, admin, client, estimate
        )
        self._with_view(rt, obs, client, now, report, admin, then=then)

    def _plan_and_apply(
        self,
        rt: ReplicaRuntime,
        obs: Observation,
        unit: UnitEstimator,
        rebuilt: bool,
        now: float,
        report: CycleReport,
        admin: Round,
        client: AdminApi,
        estimate: StepTimeEstimate,
        view: TableView,
    ) -> None:
        """The rest of the replica's cycle once its table is known: plan, then send the
        effects (their outcome is recorded when the answer comes)."""
        # The table that ran during the interval: ours from last cycle, else what we just read.
        sample = goodput_sample(rt.pool, rt.view or view, obs, unit.rates, now)
        if sample is not None:
            rt.history.add(sample)
        restart = obs.reset or (rt.record.version is not None and view.version < rt.record.version)
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
        use_live = self.settings.step_time.enabled
        ratio = estimate.ratio if use_live else np.ones_like(estimate.ratio)
        step_time_moved, rates_moved = estimates_moved(
            rt, ratio, unit.rates, replan_change=self.settings.decision.replan_change
        )
        plan = plan_replica(
            rt,
            PlanInputs(
                view=view,
                now=now,
                restart=restart,
                estimates=Estimates(
                    step_times=estimate.step_times if use_live else rt.pool.step_times,
                    rates=unit.rates,
                    relative_sigma=(
                        estimate.relative_sigma if use_live else rt.pool.relative_sigma
                    ),
                ),
                load_weights=rt.loads.weights,
                rates_moved=rebuilt and rates_moved,
                # Before the first rebuild the estimate is the profile's prior: deciding from
                # it at first sight repairs a bad starting table at once (where it runs k=0 the
                # live counts come from exploration alone and the first rebuild takes minutes).
                estimate_ready=unit.rebuilds > 0 or self.settings.decision.first_sight_from_prior,
                step_time_moved=step_time_moved,
                explore_ks=(
                    replica_exploration(rt, view, estimate, unit.rates, self.settings)
                    if use_live
                    else None
                ),
            ),
            settings=self.settings,
            dry_run=self.dry_run,
        )
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
        if plan.decision is not None:
            self._note_decision(rt, plan.decision, ratio, unit.rates, report)
        if not plan.effects:
            return
        effects, call = plan.effects, partial(self._call, admin.deadline)
        self._send(
            admin,
            rt,
            lambda: apply_effects(rt.replica, effects, view, client, call=call),
            done=lambda applied: self.outcomes.record(rt, applied, now, report),
            failed=lambda error: self.outcomes.push_failed(rt, str(error), now, report),
            now=now,
            report=report,
        )

    def _with_view(
        self,
        rt: ReplicaRuntime,
        obs: Observation,
        client: AdminApi,
        now: float,
        report: CycleReport,
        admin: Round,
        *,
        then: Callable[[TableView], None],
    ) -> None:
        """Read the table only when ours may be out of date: first sight, a restart, a failed
        or refused push, or every refresh_s. Otherwise the view our last call returned stands
        (pushes carry If-Match, so a table changed behind our back still cannot be lost)."""
        stale = rt.view is None or now - rt.view_read_at >= self.settings.admin.refresh_s
        if not (stale or obs.reset or rt.needs_decision):
            assert rt.view is not None
            then(rt.view)
            return

        def read(view: TableView) -> None:
            rt.view_read_at = now
            then(view)

        self._send(
            admin,
            rt,
            partial(self._call, admin.deadline, client.get_table, f"GET table {rt.replica}"),
            done=read,
            failed=lambda error: self.outcomes.push_failed(
                rt, f"cannot read the table: {error}", now, report
            ),
            now=now,
            report=report,
            after_deadline=False,  # planning it then would run past the cycle's budget
        )

    def _send(
        self,
        admin: Round,
        rt: ReplicaRuntime,
        action: Callable[[], T],
        *,
        done: Callable[[T], None],
        failed: Callable[[TableTuneError], None],
        now: float,
        report: CycleReport,
        after_deadline: bool = True,
    ) -> None:
        """One admin request of the replica, alongside the others' (``await_admin``)."""
        if not admin.submit(
            rt.replica, action, done=done, failed=failed, after_deadline=after_deadline
        ):
            why = "its previous admin call has not ended (the engine does not answer)"
            self.outcomes.push_failed(rt, why, now, report)

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
        report: CycleReport,
    ) -> None:
        report.decisions[rt.replica] = decision
        rt.needs_decision = False
        rt.decided_ratio, rt.decided_rates = ratio, rates
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
