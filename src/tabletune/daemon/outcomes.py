"""Recording what applied effects did: the replica's record and guard check, the daemon's
metrics, the alerts an operator sees (a table shifted, was rolled back, cannot be set)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import structlog

from tabletune.admin.protocol import TableView
from tabletune.daemon import alerts as names
from tabletune.daemon.alerts import Alert, AlertSink
from tabletune.daemon.apply import Applied
from tabletune.daemon.guard import PendingCheck
from tabletune.daemon.metrics import DaemonMetrics
from tabletune.daemon.plan import PushTable, RollBack
from tabletune.daemon.runtime import CycleReport, ReplicaRuntime
from tabletune.daemon.settings import DaemonSettings
from tabletune.daemon.trial import Trial
from tabletune.step_cells import cell_of

log = structlog.get_logger("tabletune.daemon")


@dataclass
class Outcomes:
    settings: DaemonSettings
    metrics: DaemonMetrics
    alerts: AlertSink

    def record(self, rt: ReplicaRuntime, applied: Applied, now: float, report: CycleReport) -> None:
        """Remember what the effects did: versions, tables, guard checks, metrics, alerts."""
        rt.record.version = applied.view.version
        rt.view = applied.view
        for effect in applied.done:
            if isinstance(effect, PushTable):
                self._pushed(rt, effect, applied.view, now, report)
            elif isinstance(effect, RollBack):
                self._rolled_back(rt, effect, applied.view, now, report)
            else:
                log.info(
                    "plugin settings set",
                    replica=rt.replica,
                    exploration_interval=effect.exploration_interval,
                    hysteresis=effect.hysteresis,
                    neighbour_interval=effect.neighbour_interval,
                    neighbour_burst=effect.neighbour_burst,
                    neighbour_ks=list(effect.neighbour_ks),
                )
        if applied.conflict:
            log.warning(
                "table changed under us; deciding again next cycle",
                replica=rt.replica,
                detail=applied.failure,
            )
            rt.needs_decision = True
            self.metrics.pushes.labels(rt.replica, "conflict").inc()
        elif applied.failure is not None:
            self.push_failed(rt, applied.failure, now, report)

    def _pushed(
        self,
        rt: ReplicaRuntime,
        effect: PushTable,
        view: TableView,
        now: float,
        report: CycleReport,
    ) -> None:
        decision = effect.decision
        assert decision.new is not None
        new = [list(r) for r in decision.new]
        old = decision.current
        previous_push = rt.record.pushed_at
        rt.record.previous = [list(r) for r in old] if old is not None else rt.record.previous
        rt.record.pushed = new
        rt.record.pushed_at = now
        self.metrics.pushes.labels(rt.replica, "ok").inc()
        self.metrics.last_push.labels(rt.replica).set(now)
        self.metrics.set_table(rt.replica, decision.new, view.version)
        report.pushed.append(rt.replica)
        old_edges, new_edges = decision.edges_moved
        gain = "n/a" if decision.gain is None else f"{decision.gain:+.2%}"
        old_table = str(old and [list(r) for r in old])
        self.alerts.event(
            Alert(
                names.TABLE_SHIFTED,
                f"table of {rt.replica} changed ({decision.reason})",
                f"old {old_table} -> new {new}",
                replica=rt.replica,
                pool=rt.pool.name,
                extra={
                    "old_table": old_table,
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
            version=view.version,
            old=old,
            new=decision.new,
            predicted_gain=decision.gain,
            reason=decision.reason,
            trial=decision.trial,  # (k, batch size) when this push starts a trial
        )
        # A trial is judged by the decision that follows it, on its own steps: a rollback
        # would end it the same way, with an alert and a cooldown holding that decision back.
        rt.set_trial(
            None
            if decision.trial is None or old is None
            else Trial(
                k=decision.trial[0], batch=decision.trial[1], before=tuple(old), started_at=now
            )
        )
        if rt.trial is not None:
            rt.note_tried(rt.trial.k, cell_of(rt.trial.batch)[0], now)
        stood = decision.stood_on if decision.trial is None else None
        rt.stood_on = None if stood is None else replace(stood, at=now)
        if self.settings.guard.enabled and old is not None and decision.trial is None:
            # Only samples of the table this push replaces: since the previous push, if recent.
            start = max(now - self.settings.guard.window_s, previous_push or 0.0)
            before = tuple(s for s in rt.history.until(now) if s.at > start)
            rt.pending = PendingCheck(
                pushed_at=now, pushed=decision.new, previous=old, before=before
            )

    def _rolled_back(
        self,
        rt: ReplicaRuntime,
        effect: RollBack,
        view: TableView,
        now: float,
        report: CycleReport,
    ) -> None:
        pending, verdict = effect.pending, effect.verdict
        back = [list(r) for r in pending.previous]
        rt.record.pushed, rt.record.previous = back, None
        rt.set_trial(None)
        rt.hold_until = now + self.settings.guard.cooldown_s
        rt.rolled_back_at = now
        self.metrics.rollbacks.labels(rt.replica).inc()
        self.metrics.set_table(rt.replica, pending.previous, view.version)
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

    def push_failed(self, rt: ReplicaRuntime, why: str, now: float, report: CycleReport) -> None:
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
