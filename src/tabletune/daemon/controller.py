"""One evaluation cycle: fetch -> estimate -> guard/drift -> decide -> push -> alert -> save.

Collaborators are injected (source, admin clients, alert sink, metrics, state store, clock,
sleep) so tests drive the loop with fake time and real or in-process servers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from tabletune.admin.client import AdminRefused
from tabletune.admin.protocol import TableView
from tabletune.daemon import alerts as names
from tabletune.daemon.alerts import Alert, AlertSink
from tabletune.daemon.decide import Decision, decide
from tabletune.daemon.drift import acceptance_gap, profile_ms, step_drifts
from tabletune.daemon.estimation import UnitEstimator
from tabletune.daemon.guard import (
    GoodputHistory,
    GoodputSample,
    PendingCheck,
    interval_rates,
    judge,
    predicted_tokens_per_s,
)
from tabletune.daemon.loads import LoadTracker, step_loads
from tabletune.daemon.metrics import DaemonMetrics
from tabletune.daemon.observation import Observation, SourceResult
from tabletune.daemon.profiles import PoolProfile, pool_for
from tabletune.daemon.retry import with_retries
from tabletune.daemon.settings import DaemonSettings
from tabletune.daemon.state import DaemonState, ReplicaRecord, StateStore, UnitRecord
from tabletune.errors import PermanentError, TableTuneError, TemporaryError
from tabletune.schemas.table import Range, TableError, normalize_ranges
from tabletune.solver import EstimatorState, Solution, SolverError, StepTimes, build_table

log = structlog.get_logger("tabletune.daemon")


class Source(Protocol):
    def collect(
        self, now: float, *, on_replica: Callable[[], bool] | None = None
    ) -> SourceResult: ...


class AdminApi(Protocol):
    def get_table(self) -> TableView: ...

    def put_table(
        self,
        table: Sequence[Sequence[int]],
        *,
        if_match: int | None = None,
        allow_uncaptured: bool = False,
    ) -> TableView: ...

    def put_settings(
        self,
        *,
        exploration_interval: int | None = None,
        hysteresis: int | None = None,
        if_match: int | None = None,
    ) -> TableView: ...


@dataclass
class ReplicaRuntime:
    """What the daemon knows about one replica between cycles."""

    replica: str
    admin_url: str
    pool: PoolProfile
    record: ReplicaRecord
    loads: LoadTracker
    history: GoodputHistory
    step_totals: dict[tuple[int, str], tuple[float, float]] = field(default_factory=dict)
    pending: PendingCheck | None = None
    hold_until: float = 0.0
    needs_decision: bool = True  # first sight, a failed push, a version race
    view: TableView | None = None
    view_read_at: float = 0.0


@dataclass
class CycleReport:
    """What one cycle saw and did (for logs, --once, the demo and tests)."""

    started: float
    observed: list[str] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)
    outage: str | None = None
    rebuilt: list[str] = field(default_factory=list)
    decisions: dict[str, Decision] = field(default_factory=dict)
    pushed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    abandoned: bool = False


def _ranges(table: list[list[int]] | None) -> tuple[Range, ...] | None:
    if table is None:
        return None
    try:
        return normalize_ranges(table)
    except TableError:
        return None


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
        self._bucket_ms: dict[str, dict[tuple[int, str], float | None]] = {}
        self._solutions: dict[tuple[object, ...], Solution] = {}
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
        for key, unit in self.units.items():
            units[key] = UnitRecord(
                prior=unit.state.prior,
                weight=unit.state.weight,
                drafted=unit.state.drafted,
                accepted=unit.state.accepted,
                rates=unit.rates,
                drafts_since_rebuild=unit.drafts_since_rebuild,
                rebuilds=unit.rebuilds,
            )
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
        est = self.settings.estimator
        if saved is not None and tuple(saved.prior) == pool.prior:
            try:
                state = EstimatorState(
                    prior=tuple(saved.prior),
                    weight=saved.weight,
                    drafted=tuple(saved.drafted),
                    accepted=tuple(saved.accepted),
                )
                unit = UnitEstimator(
                    state=state,
                    rates=tuple(saved.rates),
                    drafts_since_rebuild=saved.drafts_since_rebuild,
                    rebuilds=saved.rebuilds,
                )
                if len(unit.rates) != len(state.prior):
                    raise SolverError("rates and prior differ in length")
            except SolverError as error:
                log.warning(
                    "saved estimator state incompatible, starting fresh", unit=key, error=str(error)
                )
                unit = None
        elif saved is not None:
            log.warning("prior changed since the state was saved; counts dropped", unit=key)
        if unit is None:
            unit = UnitEstimator.start(pool.prior, settings=est)
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
        )
        self.replicas[obs.replica] = rt
        return rt

    def unit_key(self, rt: ReplicaRuntime) -> str:
        return rt.replica if self.settings.estimator.scope == "replica" else rt.pool.name

    # ---- the cycle -----------------------------------------------------------------------
    def run_cycle(self) -> CycleReport:
        now = self.clock()
        self._solutions.clear()
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
                self._acceptance_checks(key, pool, unit, now, checked)
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

    def _acceptance_checks(
        self,
        key: str,
        pool: PoolProfile,
        unit: UnitEstimator,
        now: float,
        checked: set[tuple[str, str]],
    ) -> None:
        for i, (rate, prior) in enumerate(zip(unit.rates, pool.prior, strict=True), start=1):
            self.metrics.acceptance.labels(key, str(i)).set(rate)
            self.metrics.acceptance_prior.labels(key, str(i)).set(prior)
        by_replica = self.settings.estimator.scope == "replica"
        replica, pool_label = (key, pool.name) if by_replica else ("", key)
        checked.add((replica, "") if by_replica else ("", pool_label))
        position, gap = acceptance_gap(unit.rates, pool.prior)
        if abs(gap) > self.settings.drift.acceptance_threshold:
            self.alerts.condition(
                Alert(
                    names.ACCEPTANCE_DRIFT,
                    f"acceptance moved away from the prior at position {position}",
                    f"a_hat_{position} - a_prior_{position} = {gap:+.3f}; a_hat="
                    f"{[round(r, 3) for r in unit.rates]}, prior={list(pool.prior)}",
                    replica=replica,
                    pool=pool_label,
                ),
                now,
            )

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
        self._drift_checks(rt, obs, now)
        client = self.admin_for(rt.admin_url)
        # Read the table only when ours may be out of date: first sight, a restart, a failed or
        # refused push, or every refresh_s. Otherwise the view our last call returned stands
        # (pushes carry If-Match, so a table changed behind our back still cannot be lost).
        stale_view = rt.view is None or now - rt.view_read_at >= self.settings.admin.refresh_s
        if stale_view or obs.reset or rt.needs_decision:
            try:
                view = self._call(lambda: client.get_table(), f"GET table {rt.replica}")
            except TableTuneError as error:
                self._push_failed(rt, f"cannot read the table: {error}", now, report)
                return
            rt.view_read_at = now
        else:
            assert rt.view is not None
            view = rt.view
        # The table that ran during the interval: ours from last cycle, else what we just read.
        self._goodput_sample(rt, rt.view or view, obs, unit, now)
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
        if view is not rt.view:
            rt.record.version = view.version
            rt.view = view
            current = _ranges(view.table)
            if current is not None:
                self.metrics.set_table(rt.replica, current, view.version)
        if not self.dry_run:
            try:
                view = self._sync_plugin_settings(rt, view, client)
            except TableTuneError as error:
                self._push_failed(rt, f"cannot set exploration/hysteresis: {error}", now, report)
                return
        if rt.pending is not None and self._guard(rt, view, client, now, report):
            return
        # Before the first rebuild the estimate is the profile's prior: deciding from it at
        # first sight repairs a bad starting table at once (where it runs k=0 the live counts
        # come from exploration alone and the first rebuild can take minutes).
        estimate_ready = unit.rebuilds > 0 or self.settings.decision.first_sight_from_prior
        decide_now = rebuilt or (estimate_ready and (restart or rt.needs_decision))
        if not decide_now:
            return
        if now < rt.hold_until:
            log.info(
                "push held after a rollback", replica=rt.replica, for_s=round(rt.hold_until - now)
            )
            return
        decision = decide(
            step_times=rt.pool.step_times,
            rates=unit.rates,
            view=view,
            load_weights=rt.loads.weights,
            settings=self.settings.decision,
            force=restart,
            build=self._build,
        )
        report.decisions[rt.replica] = decision
        rt.needs_decision = False
        if decision.gain is not None:
            self.metrics.predicted_gain.labels(rt.replica).set(decision.gain)
        if not decision.push or decision.new is None:
            log.debug("no push", replica=rt.replica, reason=decision.reason)
            return
        if self.dry_run:
            log.info(
                "dry run: would push",
                replica=rt.replica,
                reason=decision.reason,
                old=decision.current,
                new=decision.new,
                gain=decision.gain,
            )
            return
        self._push(rt, view, client, decision, now, report)

    def _call(self, action: Callable[[], TableView], what: str) -> TableView:
        return with_retries(
            action, what=what, backoffs_s=self.settings.admin.retry_backoffs_s, sleep=self.sleep
        )

    def _sync_plugin_settings(
        self, rt: ReplicaRuntime, view: TableView, client: AdminApi
    ) -> TableView:
        wanted = self.settings.plugin
        if (view.exploration_interval, view.hysteresis) == (
            wanted.exploration_interval,
            wanted.hysteresis,
        ):
            return view
        new_view = self._call(
            lambda: client.put_settings(
                exploration_interval=wanted.exploration_interval,
                hysteresis=wanted.hysteresis,
                if_match=view.version,
            ),
            f"PUT settings {rt.replica}",
        )
        log.info(
            "plugin settings set",
            replica=rt.replica,
            exploration_interval=wanted.exploration_interval,
            hysteresis=wanted.hysteresis,
        )
        rt.record.version = new_view.version
        rt.view = new_view
        return new_view

    def _push(
        self,
        rt: ReplicaRuntime,
        view: TableView,
        client: AdminApi,
        decision: Decision,
        now: float,
        report: CycleReport,
    ) -> bool:
        assert decision.new is not None
        new = [list(r) for r in decision.new]
        try:
            pushed = self._call(
                lambda: client.put_table(new, if_match=view.version), f"PUT table {rt.replica}"
            )
        except AdminRefused as error:
            if error.status == 409:  # someone changed it meanwhile: look again next cycle
                log.warning(
                    "table changed under us; deciding again next cycle",
                    replica=rt.replica,
                    detail=error.detail,
                )
                rt.needs_decision = True
                self.metrics.pushes.labels(rt.replica, "conflict").inc()
                return False
            self._push_failed(rt, f"refused: {error}", now, report)
            return False
        except (TemporaryError, PermanentError) as error:
            self._push_failed(rt, str(error), now, report)
            return False
        old = decision.current
        previous_push = rt.record.pushed_at
        rt.record.previous = [list(r) for r in old] if old is not None else rt.record.previous
        rt.record.pushed = new
        rt.record.version = pushed.version
        rt.record.pushed_at = now
        rt.view = pushed
        self.metrics.pushes.labels(rt.replica, "ok").inc()
        self.metrics.last_push.labels(rt.replica).set(now)
        self.metrics.set_table(rt.replica, decision.new, pushed.version)
        report.pushed.append(rt.replica)
        old_edges, new_edges = decision.edges_moved
        gain = "n/a" if decision.gain is None else f"{decision.gain:+.2%}"
        self.alerts.event(
            Alert(
                names.TABLE_SHIFTED,
                f"table of {rt.replica} changed ({decision.reason})",
                f"old {old and [list(r) for r in old]} -> new {new}",
                replica=rt.replica,
                pool=rt.pool.name,
                extra={
                    "old_table": str(old and [list(r) for r in old]),
                    "new_table": str(new),
                    "edges_moved": f"{list(old_edges)} -> {list(new_edges)}",
                    "predicted_gain": gain,
                },
            ),
            now,
        )
        log.info(
            "table pushed",
            replica=rt.replica,
            version=pushed.version,
            old=old,
            new=decision.new,
            predicted_gain=decision.gain,
            reason=decision.reason,
        )
        if self.settings.guard.enabled and old is not None:
            # Only samples of the table this push replaces: since the previous push, if recent.
            start = max(now - self.settings.guard.window_s, previous_push or 0.0)
            before = tuple(s for s in rt.history.until(now) if s.at > start)
            rt.pending = PendingCheck(
                pushed_at=now, pushed=decision.new, previous=old, before=before
            )
        return True

    def _push_failed(self, rt: ReplicaRuntime, why: str, now: float, report: CycleReport) -> None:
        report.failed.append(rt.replica)
        rt.needs_decision = True  # nothing lost: the same decision is made again next cycle
        self.metrics.errors.labels("admin").inc()
        self.metrics.pushes.labels(rt.replica, "failed").inc()
        self.alerts.condition(
            Alert(
                names.PUSH_FAILED,
                f"cannot update the table of {rt.replica}",
                why,
                replica=rt.replica,
                pool=rt.pool.name,
            ),
            now,
        )

    def _guard(
        self,
        rt: ReplicaRuntime,
        view: TableView,
        client: AdminApi,
        now: float,
        report: CycleReport,
    ) -> bool:
        """Judge the last push; True when it was rolled back (nothing more this cycle)."""
        pending = rt.pending
        assert pending is not None
        verdict = judge(
            pending.before,
            rt.history.since(pending.pushed_at),
            elapsed_s=now - pending.pushed_at,
            settings=self.settings.guard,
        )
        if verdict.outcome == "wait":
            return False
        rt.pending = None
        if verdict.outcome != "drop":
            log.info(
                "push guard passed",
                replica=rt.replica,
                outcome=verdict.outcome,
                change=verdict.change,
                samples=verdict.samples,
            )
            return False
        if self.dry_run:
            return False
        back = [list(r) for r in pending.previous]
        try:
            rolled = self._call(
                lambda: client.put_table(back, if_match=view.version),
                f"PUT table (rollback) {rt.replica}",
            )
        except TableTuneError as error:
            self._push_failed(rt, f"rollback failed: {error}", now, report)
            return True
        rt.record.pushed, rt.record.previous = back, None
        rt.record.version = rolled.version
        rt.view = rolled
        rt.hold_until = now + self.settings.guard.cooldown_s
        self.metrics.rollbacks.labels(rt.replica).inc()
        self.metrics.set_table(rt.replica, pending.previous, rolled.version)
        report.rolled_back.append(rt.replica)
        change = f"{verdict.change:+.1%}" if verdict.change is not None else "?"
        self.alerts.event(
            Alert(
                names.ROLLBACK,
                f"table of {rt.replica} rolled back: goodput {change} at similar load",
                f"pushed {[list(r) for r in pending.pushed]}, restored {back}; samples "
                f"before/after {verdict.samples}",
                replica=rt.replica,
                pool=rt.pool.name,
            ),
            now,
        )
        return True

    def _goodput_sample(
        self,
        rt: ReplicaRuntime,
        ran_view: TableView,
        obs: Observation,
        unit: UnitEstimator,
        now: float,
    ) -> None:
        """Record measured vs predicted goodput of the table that ran during the interval."""
        ran = _ranges(ran_view.table)
        if obs.mean_batch is None or ran is None:
            return
        rates = interval_rates(obs.drafted, obs.accepted, unit.rates)
        loads = step_loads(obs) or {
            (max(1, round(obs.mean_batch)), max(1, round(obs.mean_batch))): 1.0
        }
        predicted = predicted_tokens_per_s(
            rt.pool.step_times,
            ran,
            loads,
            rates,
            max_k=ran_view.num_speculative_tokens,
            exploration_interval=ran_view.exploration_interval,
            t_ms=rt.pool.t_ms,
        )
        if predicted:
            rt.history.add(GoodputSample(now, obs.mean_batch, obs.tokens_per_s, predicted))

    def _build(
        self,
        step_times: StepTimes,
        rates: Sequence[float],
        *,
        allowed_k: Sequence[int],
        max_batch: int,
        stickiness: float,
    ) -> Solution:
        """``build_table``, shared within a cycle by replicas with the same inputs (a pool)."""
        key = (id(step_times), tuple(rates), tuple(allowed_k), max_batch, stickiness)
        solution = self._solutions.get(key)
        if solution is None:
            solution = build_table(
                step_times, rates, allowed_k=allowed_k, max_batch=max_batch, stickiness=stickiness
            )
            self._solutions[key] = solution
        return solution

    def _expected_ms(self, pool: PoolProfile) -> Callable[[int, str], float | None]:
        """Profile T averaged over a batch bucket, computed once per (pool, k, bucket)."""
        cache = self._bucket_ms.setdefault(pool.name, {})

        def lookup(k: int, bucket: str) -> float | None:
            key = (k, bucket)
            if key not in cache:
                cache[key] = profile_ms(pool.step_times, k, bucket)
            return cache[key]

        return lookup

    def _drift_checks(self, rt: ReplicaRuntime, obs: Observation, now: float) -> None:
        memory = self.settings.decision.load_memory
        totals = {key: (s * memory, c * memory) for key, (s, c) in rt.step_totals.items()}
        for key, (seconds, steps) in obs.step_times.items():
            s0, c0 = totals.get(key, (0.0, 0.0))
            totals[key] = (s0 + seconds, c0 + steps)
        rt.step_totals = {key: v for key, v in totals.items() if v[1] > 1e-3}
        drifts = step_drifts(
            rt.pool.step_times,
            rt.step_totals,
            min_steps=self.settings.drift.min_steps,
            expected_ms=self._expected_ms(rt.pool),
        )
        worst = None
        for d in drifts:
            self.metrics.step_time_ratio.labels(rt.replica, str(d.k), d.bucket).set(d.ratio)
            if abs(d.ratio - 1.0) > self.settings.drift.profile_threshold and (
                worst is None or abs(d.ratio - 1) > abs(worst.ratio - 1)
            ):
                worst = d
        if worst is not None:
            self.alerts.condition(
                Alert(
                    names.PROFILE_DRIFT,
                    f"step times of {rt.replica} differ from the profile",
                    f"k={worst.k}, B in {worst.bucket}: live {worst.live_ms:.2f} ms vs profile "
                    f"{worst.profile_ms:.2f} ms ({worst.ratio:.2f}x over {worst.steps:.0f} steps)",
                    replica=rt.replica,
                    pool=rt.pool.name,
                ),
                now,
            )
