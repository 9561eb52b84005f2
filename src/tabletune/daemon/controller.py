"""One evaluation cycle: fetch -> estimate (a_hat per unit, T_hat per replica) -> checks ->
plan (pure, ``daemon.plan``) -> apply (``daemon.apply``) -> forget -> alert -> save; a
replica's part, from its estimate to its effects, is ``daemon.replica_turn``.

Replicas' admin calls run side by side (``daemon.replica_io``): a replica's table read and its
effects are sent as soon as its plan is made, and the cycle waits for them no longer than its
budget (``LOOP__CYCLE_BUDGET`` of the interval); a replica still unanswered then is that
replica's problem this cycle. Planning and recording stay on the cycle's thread.

Collaborators are injected (source, admin clients, alert sink, metrics, state store, clock,
sleep, replica I/O) so tests drive the loop with fake time and real or in-process servers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import structlog

from tabletune.daemon import alerts as names
from tabletune.daemon.alerts import Alert, AlertSink
from tabletune.daemon.apply import AdminApi
from tabletune.daemon.checks import Checks
from tabletune.daemon.deadlines import CycleBudget
from tabletune.daemon.estimation import UnitEstimator
from tabletune.daemon.guard import (
    GoodputHistory,
)
from tabletune.daemon.loads import LoadTracker
from tabletune.daemon.metrics import DaemonMetrics
from tabletune.daemon.observation import Observation, SourceResult
from tabletune.daemon.outcomes import Outcomes
from tabletune.daemon.presence import Presence
from tabletune.daemon.profiles import PoolProfile, pool_for
from tabletune.daemon.replica_io import ReplicaIo
from tabletune.daemon.replica_turn import ReplicaTurn
from tabletune.daemon.runtime import CycleReport, ReplicaRuntime
from tabletune.daemon.settings import DaemonSettings
from tabletune.daemon.state import DaemonState, ReplicaRecord, StateStore, UnitRecord
from tabletune.daemon.step_time import (
    StepTimeEstimator,
    StepTimeLayout,
)
from tabletune.errors import TableTuneError

log = structlog.get_logger("tabletune.daemon")
T = TypeVar("T")

__all__ = ["AdminApi", "Controller", "CycleReport", "Source"]


class Source(Protocol):
    def collect(
        self, now: float, *, on_replica: Callable[[], bool] | None = None
    ) -> SourceResult: ...

    def forget(self, replica: str) -> None: ...


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
        sleep: Callable[[float], None] | None = None,
        io: ReplicaIo | None = None,
        dry_run: bool = False,
    ) -> None:
        """``sleep`` waits between admin retries (default: a wait that ends when the daemon
        stops); ``io`` runs the replicas' admin calls side by side."""
        self.settings = settings
        self.source = source
        self.pools = tuple(pools)
        self.admin_for = admin_for
        self.alerts = alerts
        self.metrics = metrics
        self.store = store
        self.clock = clock
        self._stop = threading.Event()
        self.sleep = sleep or self._wait
        self.io = io or ReplicaIo(workers=settings.loop.concurrency)
        self.dry_run = dry_run
        self.units: dict[str, UnitEstimator] = {}
        self.replicas: dict[str, ReplicaRuntime] = {}
        self._saved_replicas: dict[str, ReplicaRecord] = {}
        self._saved_units: dict[str, UnitRecord] = {}
        self._layouts = {pool.name: StepTimeLayout.of_pool(pool) for pool in self.pools}
        self.checks = Checks(settings, metrics, alerts)
        self.outcomes = Outcomes(settings, metrics, alerts)
        self.turn = ReplicaTurn(
            settings=settings,
            metrics=metrics,
            checks=self.checks,
            outcomes=self.outcomes,
            io=self.io,
            admin_for=admin_for,
            replicas=self.replicas,
            stop=self._stop,
            sleep=self.sleep,
            dry_run=dry_run,
        )
        self.presence = Presence(forget_after_s=settings.loop.forget_after_s)
        self.last_cycle_end: float | None = None
        self.last_evaluation: float | None = None

    def _wait(self, seconds: float) -> None:
        self._stop.wait(seconds)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @stopping.setter
    def stopping(self, value: bool) -> None:
        """True (SIGTERM): waits for replicas and between retries end at once."""
        if value:
            self._stop.set()
        else:
            self._stop.clear()

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
            watched_since=self.clock(),
        )
        self.replicas[obs.replica] = rt
        return rt

    def unit_key(self, rt: ReplicaRuntime) -> str:
        return rt.replica if self.settings.estimator.scope == "replica" else rt.pool.name

    # ---- the cycle -----------------------------------------------------------------------
    def run_cycle(self) -> CycleReport:
        now = self.clock()
        budget = CycleBudget.of(
            self.io.monotonic(),
            interval_s=self.settings.loop.interval_s,
            share=self.settings.loop.cycle_budget,
        )
        report = CycleReport(started=now)
        checked: set[tuple[str, str]] = {("", "")}  # (replica, pool) scopes re-evaluated
        try:
            result = self.source.collect(now, on_replica=lambda: not self.stopping)
        except TableTuneError as error:  # a source that failed as a whole
            result = SourceResult(observations={}, outage=str(error))
        report.outage = result.outage
        # Forgetting needs evidence that the source works: a cycle without data from anyone
        # does not count towards anyone's TTL.
        self.presence.cycle(now, source_saw_any=bool(result.observations))
        if result.outage is not None:
            self.metrics.errors.labels("source").inc()
            self.alerts.condition(
                Alert(names.STALE_DATA, "no fresh data: the metrics source failed", result.outage),
                now,
            )
            self._finish(report, now, checked)
            return report
        for replica in self._saved_replicas:  # restored, not seen yet: its clock starts
            self.presence.seen(replica, now)
        for replica, problem in result.problems.items():
            report.problems[replica] = problem
            self.presence.seen(replica, now)
            if self.presence.forgotten(replica):
                continue  # gone: no alert and no series until it has data again
            checked.add((replica, ""))
            self.metrics.stale.labels(replica).set(1)
            self.alerts.condition(
                Alert(names.STALE_DATA, f"no fresh data from {replica}", problem, replica=replica),
                now,
            )
        grouped: dict[str, list[tuple[ReplicaRuntime, Observation]]] = {}
        for obs in result.observations.values():
            self.presence.data(obs.replica, now)
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
        admin = self.io.round(
            "admin",
            deadline=budget.deadline,
            patience_s=self.settings.admin.timeout_s,
            stopped=lambda: self.stopping,
        )
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
                self.turn.start(rt, obs, unit, rebuilt, now, report, admin)
        self.turn.await_admin(admin, now, report)
        named = {*result.problems, *result.observations}
        for replica in self.presence.due(now, named=named):
            self._forget(replica, now, report)
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

    def _forget(self, replica: str, now: float, report: CycleReport) -> None:
        """The replica had no data for forget_after_s: its alerts resolve, its series, runtime
        and saved records go, and its source starts afresh should it come back."""
        log.info(
            "replica forgotten", replica=replica, without_data_s=self.settings.loop.forget_after_s
        )
        self.alerts.forget(replica, now)
        self.metrics.forget(replica)
        self.replicas.pop(replica, None)
        self._saved_replicas.pop(replica, None)
        self.units.pop(replica, None)  # its own estimator unit (replica scope)
        self._saved_units.pop(replica, None)
        self.source.forget(replica)
        report.forgotten.append(replica)
