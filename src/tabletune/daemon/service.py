"""Building the daemon from settings and running it: APScheduler runs the cycle, a failed cycle
is logged with its traceback and the loop goes on; SIGTERM abandons what the cycle still waits
for (replicas' answers, retry waits), saves the state and exits 0; systemd hears READY=1 and
WATCHDOG=1. One pool of worker threads and one HTTP connection pool serve every replica."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType

import httpx
import structlog
from apscheduler.schedulers.background import BackgroundScheduler

from tabletune.admin.auth import own_token
from tabletune.admin.client import AdminClient
from tabletune.daemon.alerts import Alert, AlertmanagerClient, AlertSink
from tabletune.daemon.controller import Controller, CycleReport, Source
from tabletune.daemon.direct_source import DirectSource
from tabletune.daemon.metrics import PREFIX, DaemonMetrics, MetricsServer
from tabletune.daemon.profiles import load_pools
from tabletune.daemon.prometheus_source import PrometheusSource
from tabletune.daemon.replica_io import ReplicaIo
from tabletune.daemon.sdnotify import Notifier
from tabletune.daemon.settings import DaemonSettings, masked
from tabletune.daemon.state import StateStore
from tabletune.errors import InputError

log = structlog.get_logger("tabletune.daemon")


@dataclass
class Daemon:
    """The assembled daemon; ``close`` releases its clients."""

    settings: DaemonSettings
    controller: Controller
    metrics: DaemonMetrics
    closers: list[Callable[[], None]] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)

    def healthy(self) -> bool:
        """The loop is alive: a cycle ended recently (or we just started)."""
        allowance = 3 * self.settings.loop.interval_s + 60.0
        last = self.controller.last_cycle_end or self.started_at
        return time.time() - last < allowance

    def safe_cycle(self) -> CycleReport | None:
        try:
            report = self.controller.run_cycle()
        except Exception:  # the loop must survive any one bad cycle; the traceback is logged
            self.metrics.cycles.labels("failed").inc()
            self.metrics.errors.labels("cycle").inc()
            log.exception("cycle failed")
            self.controller.last_cycle_end = time.time()
            return None
        self.metrics.cycles.labels("ok").inc()
        ended = self.controller.last_cycle_end or report.started
        log.info(
            "cycle done",
            seconds=round(ended - report.started, 3),
            observed=len(report.observed),
            problems=report.problems,
            outage=report.outage,
            rebuilt=report.rebuilt,
            pushed=report.pushed,
            failed=report.failed,
            rolled_back=report.rolled_back,
            forgotten=report.forgotten,
            deferred=len(report.deferred),
            abandoned=report.abandoned,
        )
        return report

    def close(self) -> None:
        for close in reversed(self.closers):
            close()


def build_daemon(
    settings: DaemonSettings,
    *,
    dry_run: bool = False,
    metrics: DaemonMetrics | None = None,
) -> Daemon:
    pools = load_pools(settings.profile)
    metrics = metrics or DaemonMetrics()
    closers: list[Callable[[], None]] = []
    io = ReplicaIo(workers=settings.loop.concurrency)
    source: Source
    if settings.source.prometheus_url:
        prometheus = PrometheusSource(
            settings=settings.source, default_window_s=settings.loop.interval_s
        )
        closers.append(prometheus.close)
        source = prometheus
    else:
        if not settings.source.replicas:
            raise InputError(
                "TABLETUNE_SOURCE__REPLICAS: give the replicas' base URLs (comma-separated), "
                "or set TABLETUNE_SOURCE__PROMETHEUS_URL"
            )
        direct = DirectSource(
            settings=settings.source,
            io=io,
            budget_s=settings.loop.cycle_budget * settings.loop.interval_s,
        )
        closers.append(direct.close)
        source = direct
    poster = None
    if settings.alerts.alertmanager_url:
        am = AlertmanagerClient(settings=settings.alerts)
        closers.append(am.close)
        poster = am.post

    def on_change(alert: Alert, firing: bool) -> None:
        metrics.alerts.labels(alert.name, alert.replica, alert.pool).set(1 if firing else 0)

    alerts = AlertSink(
        settings=settings.alerts,
        condition_ttl_s=4 * settings.loop.interval_s + 60.0,
        poster=poster,
        on_change=on_change,
    )
    token = own_token(
        settings.admin.token.get_secret_value() if settings.admin.token else None,
        settings.admin.token_file,
    )
    # One connection pool for every replica's admin API (a client each cost ~0.8 MB).
    pool = settings.loop.concurrency
    admin_http = httpx.Client(
        timeout=settings.admin.timeout_s,
        limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
    )
    closers.append(admin_http.close)

    def admin_for(url: str) -> AdminClient:
        return AdminClient(url, token=token, http=admin_http)

    controller = Controller(
        settings=settings,
        source=source,
        pools=pools,
        admin_for=admin_for,
        alerts=alerts,
        metrics=metrics,
        store=StateStore(settings.state.dir),
        io=io,
        dry_run=dry_run,
    )
    controller.restore()
    if isinstance(source, PrometheusSource):
        source.last_evaluation = controller.last_evaluation
    return Daemon(settings=settings, controller=controller, metrics=metrics, closers=closers)


@dataclass(frozen=True)
class OnceOutcome:
    """What ``--once`` did; ``problem`` says why it did not do its job (exit 1)."""

    report: CycleReport | None
    problem: str | None


def once_problem(report: CycleReport | None, *, saved: bool) -> str | None:
    if report is None:
        return "the cycle failed (its traceback is in the log)"
    if not report.observed:
        why = report.outage or "; ".join(f"{r}: {p}" for r, p in report.problems.items())
        return f"no replica observed ({why or 'none found'})"
    if not saved:
        return "the state could not be saved (see the log)"
    return None


def report_json(outcome: OnceOutcome) -> str:
    report = outcome.report
    if report is None:
        return json.dumps({"ok": False, "problem": outcome.problem})
    return json.dumps(
        {
            "ok": outcome.problem is None,
            "problem": outcome.problem,
            "observed": report.observed,
            "problems": report.problems,
            "outage": report.outage,
            "rebuilt": report.rebuilt,
            "decisions": {
                replica: {
                    "push": d.push,
                    "reason": d.reason,
                    "current": d.current,
                    "new": d.new,
                    "predicted_gain": d.gain,
                }
                for replica, d in report.decisions.items()
            },
            "pushed": report.pushed,
            "failed": report.failed,
        },
        indent=2,
    )


def run_once(daemon: Daemon, *, sleep: Callable[[float], None] = time.sleep) -> OnceOutcome:
    """One evaluation. Direct scrapes need two reads: a baseline, then one interval later."""
    source = daemon.controller.source
    if isinstance(source, DirectSource) and not source.has_baseline():
        daemon.safe_cycle()
        sleep(daemon.settings.loop.interval_s)
    failed_saves = _failed_saves(daemon)
    report = daemon.safe_cycle()
    daemon.controller.save()
    saved = _failed_saves(daemon) == failed_saves
    return OnceOutcome(report, once_problem(report, saved=saved))


def _failed_saves(daemon: Daemon) -> float:
    """The controller logs and counts a failed save (the loop goes on); --once must say it."""
    return daemon.metrics.sample(f"{PREFIX}_errors_total", {"kind": "state"}) or 0.0


def run_forever(daemon: Daemon, *, notifier: Notifier | None = None) -> int:
    """Run until SIGTERM/SIGINT; returns the exit code (0 on a clean stop)."""
    notifier = notifier or Notifier()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("stopping", signal=signal.Signals(signum).name)
        daemon.controller.stopping = True  # the running cycle abandons the replicas left
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = None
    if daemon.settings.server.port:
        server = MetricsServer(
            registry=daemon.metrics.registry,
            healthy=daemon.healthy,
            host=daemon.settings.server.host,
            port=daemon.settings.server.port,
        )
        server.start()
        log.info("serving /metrics and /healthz", port=server.port)
    scheduler = BackgroundScheduler(timezone=UTC)
    scheduler.add_job(
        daemon.safe_cycle,
        "interval",
        seconds=daemon.settings.loop.interval_s,
        next_run_time=datetime.now(UTC),
        max_instances=1,
        coalesce=True,
        misfire_grace_time=None,
        id="cycle",
    )
    if notifier.watchdog_s:

        def ping() -> None:
            if daemon.healthy():
                notifier.watchdog()

        scheduler.add_job(ping, "interval", seconds=notifier.watchdog_s / 2, id="watchdog")
    scheduler.start()
    notifier.ready()
    log.info("daemon started", config=masked(daemon.settings), systemd=notifier.enabled)
    while not stop.wait(timeout=1.0):
        pass
    notifier.stopping()
    scheduler.shutdown(wait=True)  # the running cycle finishes (or abandons) first
    daemon.controller.save()
    if server is not None:
        server.stop()
    daemon.close()
    log.info(
        "daemon stopped; state saved",
        path=str(daemon.controller.store.path) if daemon.controller.store else None,
    )
    return 0
