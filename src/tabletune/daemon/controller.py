"""One evaluation cycle: fetch -> estimate (a_hat per unit, T_hat per replica) -> checks ->
plan (pure, ``daemon.plan``) -> apply (``daemon.apply``) -> alert -> save.

Collaborators are injected (source, admin clients, alert sink, metrics, state store, clock,
sleep) so tests drive the loop with fake time and real or in-process servers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import structlog

from tabletune.admin.protocol import TableView
from tabletune.daemon import alerts as names
from tabletune.daemon.alerts import Alert, AlertSink
from tabletune.daemon.apply import AdminApi, apply_effects
from tabletune.daemon.checks import Checks
from tabletune.daemon.decide import Decision, Estimates
from tabletune.daemon.estimation import UnitEstimator
from tabletune.daemon.explore import replica_exploration
from tabletune.daemon.guard import (
    GoodputHistory,
    goodput_sample,
    view_ranges,
)
from tabletune.daemon.loads import LoadTracker
from tabletune.daemon.metrics import DaemonMetrics
from tabletune.daemon.observation import Observation, SourceResult
from tabletune.daemon.outcomes import Outcomes
from tabletune.daemon.plan import PlanInputs, estimates_moved, plan_replica
from tabletune.daemon.profiles import PoolProfile, pool_for
from tabletune.daemon.retry import with_retries
from tabletune.daemon.runtime import CycleReport, ReplicaRuntime
from tabletune.daemon.settings import DaemonSettings
from tabletune.daemon.state import DaemonState, ReplicaRecord, StateStore, UnitRecord
from tabletune.daemon.step_time import (
    StepTimeEstimator,
    StepTimeLayout,
    StepTimeParams,
)
from tabletune.errors import TableTuneError

log = structlog.get_logger("tabletune.daemon")

__all__ = ["AdminApi", "Controller", "CycleReport", "Source"]


class Source(Protocol):
    def collect(
        self, now: float, *, on_replica: Callable[[], bool] | None = None
    ) -> SourceResult: ...


class Controller:
    """Keeps each replica's table right; ``run_cycle`` is one evaluation."""

    def __init__(
        self,
        *,
        settings: DaemonSettings,
        source: Source,
        pools: Sequence[PoolProfile],
        admin_for: Callable[[str], AdminApi],
        alerts: AlertSink,
        metrics: DaemonMetrics,
        store: StateStore | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        dry_run: bool = False,
    ) -> None:
        self.settings = settings
        self.source = source
        self.pools = tuple(pools)
        self.admin_for = admin_for
        self.alerts = alerts
        self.metrics = metrics
        self.store = store
        self.clock = clock
        self.sleep = sleep
        self.dry_run = dry_run
        self.units: dict[str, UnitEstimator] = {}
        self.replicas: dict[str, ReplicaRuntime] = {}
        self._saved_replicas: dict[str, ReplicaRecord] = {}
        self._saved_units: dict[str, UnitRecord] = {}
        self._layouts = {
            pool.name: StepTimeLayout(pool.step_times, pool.step_times.max_batch)
            for pool in self.pools
        }
        self._params = StepTimeParams(**settings.step_time.model_dump(exclude={"enabled", "shift"}))
        self.checks = Checks(settings, metrics, alerts)
        self.outcomes = Outcomes(settings, metrics, alerts)
        self.stopping = False
        self.last_cycle_end: float | None = None
        self.last_evaluation: float | None = None

    # ---- state ---------------------------------------------------------------------------
    def restore(self) -> None:
        """Load the saved state; an unusable file is reported (log + alert), never fatal."""
        if self.store is None:
            return
        state, problem = self.store.load()
        if problem is not None:
            self.metrics.errors.labels("state").inc()
            log.error("state file unusable, starting fresh", problem=problem)
            self.alerts.event(
                Alert(names.STATE_RESET, "daemon state was unusable; started fresh", problem),
                self.clock(),
            )
        self._saved_units = dict(state.units)
        self._saved_replicas = dict(state.replicas)
        self.last_evaluation = state.last_evaluation
        log.info("state restored", units=len(state.units), replicas=len(state.replicas))

    def snapshot(self) -> DaemonState:
        units = dict(self._saved_units)
        units.update({key: unit.record() for key, unit in self.units.items()})
        replicas = dict(self._saved_replicas)
        replicas.update({key: rt.record for key, rt in self.replicas.items()})
        return DaemonState(
            saved_at=self.clock(),
            last_evaluation=getattr(self.source, "last_evaluation", self.last_evaluation),
            units=units,
            replicas=replicas,
        )

    def save(self) -> None:
        if self.store is None:
            return
        try:
            self.store.save(self.snapshot())
        except OSError as error:
            self.metrics.errors.labels("state").inc()
            log.error("could not save state", error=str(error), path=str(self.store.path))

    def _unit(self, key: str, pool: PoolProfile) -> UnitEstimator:
        unit = self.units.get(key)
        if unit is not None:
            return unit
        saved = self._saved_units.pop(key, None)
        unit = None if saved is None else UnitEstimator.resume(key, saved, prior=pool.prior)
        if unit is None:
            unit = UnitEstimator.start(pool.prior, settings=self.settings.estimator)
        self.units[key] = unit
        return unit

    def _runtime(self, obs: Observation) -> ReplicaRuntime | None:
        rt = self.replicas.get(obs.replica)
        if rt is not None:
            return rt
        pool = pool_for(self.pools, obs.model_name)
        if pool is None:
            return None
        rt = ReplicaRuntime(
            replica=obs.replica,
            admin_url=obs.admin_url,
            pool=pool,
            record=self._saved_replicas.pop(obs.replica, ReplicaRecord()),
            loads=LoadTracker(memory=self.settings.decision.load_memory),
            history=GoodputHistory(keep_s=2 * self.settings.guard.window_s),
            step_time=StepTimeEstimator(self._layouts[pool.name]),
        )
        self.replicas[obs.replica] = rt
        return rt

    def unit_key(self, rt: ReplicaRuntime) -> str:
        return rt.replica if self.settings.estimator.scope == "replica" else rt.pool.name

    # ---- the cycle -----------------------------------------------------------------------
    def run_cycle(self) -> CycleReport:
        now = self.clock()
        report = CycleReport(started=now)
        checked: set[tuple[str, str]] = {("", "")}  # (replica, pool) scopes re-evaluated
        try:
            result = self.source.collect(now, on_replica=lambda: not self.stopping)
        except TableTuneError as error:  # a source that failed as a whole
            result = SourceResult(observations={}, outage=str(error))
        report.outage = result.outage
        if result.outage is not None:
            self.metrics.errors.labels("source").inc()
            self.alerts.condition(
                Alert(names.STALE_DATA, "no fresh data: the metrics source failed", result.outage),
                now,
            )
            self._finish(report, now, checked)
            return report
        for replica, problem in result.problems.items():
            report.problems[replica] = problem
            checked.add((replica, ""))
            self.metrics.stale.labels(replica).set(1)
            self.alerts.condition(
                Alert(names.STALE_DATA, f"no fresh data from {replica}", problem, replica=replica),
                now,
            )
        grouped: dict[str, list[tuple[ReplicaRuntime, Observation]]] = {}
        for obs in result.observations.values():
            rt = self._runtime(obs)
            if rt is None:
                report.problems[obs.replica] = f"no profile for model {obs.model_name!r}"
                self.alerts.condition(
                    Alert(
                        names.STALE_DATA,
                        f"no profile matches {obs.replica}",
                        f"model {obs.model_name!r}",
                        replica=obs.replica,
                    ),
                    now,
                )
                checked.add((obs.replica, ""))
                continue
            grouped.setdefault(self.unit_key(rt), []).append((rt, obs))
        for key, members in grouped.items():
            pool = members[0][0].pool
            unit = self._unit(key, pool)
            size = len(pool.prior)
            drafted = [
                sum(o.drafted[i] for _, o in members if i < len(o.drafted)) for i in range(size)
            ]
            accepted = [
                sum(o.accepted[i] for _, o in members if i < len(o.accepted)) for i in range(size)
            ]
            rebuilt = unit.add(drafted, accepted, settings=self.settings.estimator)
            if rebuilt:
                report.rebuilt.append(key)
                self.checks.acceptance(key, pool, unit, now, checked)
                log.info("estimate rebuilt", unit=key, rates=[round(r, 4) for r in unit.rates])
            for rt, obs in members:
                if self.stopping:
                    report.abandoned = True
                    break
                checked.add((rt.replica, ""))
                self.metrics.stale.labels(rt.replica).set(0)
                report.observed.append(rt.replica)
                self._replica_cycle(rt, obs, unit, rebuilt, now, report)
        self._finish(report, now, checked)
        return report

    def _finish(self, report: CycleReport, now: float, checked: set[tuple[str, str]]) -> None:
        self.save()
        self.alerts.flush(
            self.clock(),
            # An alert about a replica is re-judged when that replica was; a pool-wide or global
            # one when its pool (or the whole source) was.
            checked=lambda key: ((key[1], "") if key[1] else ("", key[2])) in checked,
        )
        self.last_cycle_end = self.clock()
        self.metrics.cycle_seconds.set(self.last_cycle_end - now)
        self.metrics.last_cycle.set(self.last_cycle_end)

    def _replica_cycle(
        self,
        rt: ReplicaRuntime,
        obs: Observation,
        unit: UnitEstimator,
        rebuilt: bool,
        now: float,
        report: CycleReport,
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
        view = self._current_view(rt, obs, client, now, report)
        if view is None:
            return
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
        applied = apply_effects(rt.replica, plan.effects, view, client, call=self._call)
        self.outcomes.record(rt, applied, now, report)

    def _current_view(
        self,
        rt: ReplicaRuntime,
        obs: Observation,
        client: AdminApi,
        now: float,
        report: CycleReport,
    ) -> TableView | None:
        """Read the table only when ours may be out of date: first sight, a restart, a failed
        or refused push, or every refresh_s. Otherwise the view our last call returned stands
        (pushes carry If-Match, so a table changed behind our back still cannot be lost)."""
        stale = rt.view is None or now - rt.view_read_at >= self.settings.admin.refresh_s
        if not (stale or obs.reset or rt.needs_decision):
            assert rt.view is not None
            return rt.view
        try:
            view = self._call(client.get_table, f"GET table {rt.replica}")
        except TableTuneError as error:
            self.outcomes.push_failed(rt, f"cannot read the table: {error}", now, report)
            return None
        rt.view_read_at = now
        return view

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

    def _call(self, action: Callable[[], TableView], what: str) -> TableView:
        return with_retries(
            action, what=what, backoffs_s=self.settings.admin.retry_backoffs_s, sleep=self.sleep
        )
