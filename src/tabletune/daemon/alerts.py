"""Alerts: always logged, exported as a gauge, and sent to Alertmanager's v2 API when set.

Two kinds: *conditions* (stale data, drift, push failures) stay firing while they hold and are
re-sent every cycle; when they stop holding they are sent once more with ``endsAt`` = now
(resolved). *Events* (table shifted, rollback) carry ``endsAt`` = their time + TTL and are
re-sent every cycle until then (Alertmanager dedupes), so an Alertmanager that restarted in
between gets them again; the newest ``ALERTS__KEEP_EVENTS`` are kept, one per label set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
import structlog

from tabletune.daemon.settings import AlertSettings
from tabletune.errors import TemporaryError

log = structlog.get_logger("tabletune.daemon.alerts")

# Names the deploy rules and docs/daemon.md refer to.
TABLE_SHIFTED = "TableTuneTableShifted"
ACCEPTANCE_DRIFT = "TableTuneAcceptanceDrift"
PROFILE_DRIFT = "TableTuneProfileDrift"
PROFILE_SHAPE = "TableTuneProfileShape"
PROFILE_SETUP = "TableTuneProfileSetup"
PLUGIN_OUTDATED = "TableTunePluginOutdated"
STALE_DATA = "TableTuneStaleData"
ROLLBACK = "TableTuneRollback"
PUSH_FAILED = "TableTunePushFailed"
STATE_RESET = "TableTuneStateReset"

SEVERITY = {
    TABLE_SHIFTED: "info",
    ACCEPTANCE_DRIFT: "warning",
    PROFILE_DRIFT: "warning",
    PROFILE_SHAPE: "warning",
    PROFILE_SETUP: "warning",
    PLUGIN_OUTDATED: "warning",
    STALE_DATA: "warning",
    ROLLBACK: "critical",
    PUSH_FAILED: "critical",
    STATE_RESET: "warning",
}


@dataclass(frozen=True)
class Alert:
    name: str
    summary: str
    description: str = ""
    replica: str = ""
    pool: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)  # more annotations

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.name, self.replica, self.pool)


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, tz=UTC).isoformat().replace("+00:00", "Z")


def to_alertmanager(alert: Alert, *, starts_at: float, ends_at: float) -> dict[str, object]:
    """Alertmanager v2 ``postableAlert``."""
    labels = {"alertname": alert.name, "severity": SEVERITY.get(alert.name, "warning")}
    if alert.replica:
        labels["replica"] = alert.replica
    if alert.pool:
        labels["pool"] = alert.pool
    return {
        "labels": labels,
        "annotations": {"summary": alert.summary, "description": alert.description, **alert.extra},
        "startsAt": _iso(starts_at),
        "endsAt": _iso(ends_at),
        "generatorURL": "tabletune://daemon",
    }


class AlertmanagerClient:
    """POST /api/v2/alerts; TemporaryError on any failure (the sink keeps what was not sent)."""

    def __init__(self, *, settings: AlertSettings, transport: httpx.BaseTransport | None = None):
        assert settings.alertmanager_url is not None
        headers: dict[str, str] = {}
        if settings.bearer_token is not None:
            headers["Authorization"] = f"Bearer {settings.bearer_token.get_secret_value()}"
        auth = None
        if settings.username is not None:
            password = settings.password.get_secret_value() if settings.password else ""
            auth = httpx.BasicAuth(settings.username, password)
        self._url = settings.alertmanager_url.rstrip("/") + "/api/v2/alerts"
        self._http = httpx.Client(
            timeout=settings.timeout_s, headers=headers, auth=auth, transport=transport
        )

    def post(self, alerts: list[dict[str, object]]) -> None:
        try:
            response = self._http.post(self._url, json=alerts)
        except httpx.HTTPError as error:
            raise TemporaryError(f"{self._url}: {type(error).__name__}: {error}") from None
        if response.status_code >= 300:
            raise TemporaryError(f"{self._url}: HTTP {response.status_code}: {response.text[:200]}")

    def close(self) -> None:
        self._http.close()


Poster = Callable[[list[dict[str, object]]], None]
UNSENT_RESOLUTIONS = 500  # resolutions kept while Alertmanager is unreachable


class AlertSink:
    """Collects a cycle's alerts, logs changes, and sends them in one batch at ``flush``."""

    def __init__(
        self,
        *,
        settings: AlertSettings,
        condition_ttl_s: float,
        poster: Poster | None = None,
        on_change: Callable[[Alert, bool], None] | None = None,
    ) -> None:
        self._settings = settings
        self._condition_ttl_s = condition_ttl_s
        self._poster = poster
        self._on_change = on_change
        self._active: dict[tuple[str, str, str], tuple[Alert, float]] = {}  # key -> (alert, since)
        self._seen: set[tuple[str, str, str]] = set()
        # key -> (postable alert, when it ends): the newest event of each label set, re-sent
        # until it ends (Alertmanager keeps one alert per label set anyway)
        self._events: dict[tuple[str, str, str], tuple[dict[str, object], float]] = {}
        self._resolved: list[dict[str, object]] = []  # resolutions not yet delivered
        self.send_errors = 0

    @property
    def active(self) -> dict[tuple[str, str, str], Alert]:
        return {key: alert for key, (alert, _) in self._active.items()}

    @property
    def events(self) -> dict[tuple[str, str, str], dict[str, object]]:
        """The events still re-sent, by label set."""
        return {key: payload for key, (payload, _) in self._events.items()}

    def condition(self, alert: Alert, now: float) -> None:
        """The condition holds this cycle (firing)."""
        self._seen.add(alert.key)
        since = self._active[alert.key][1] if alert.key in self._active else now
        if alert.key not in self._active:
            log.warning(
                "alert firing",
                alertname=alert.name,
                replica=alert.replica,
                pool=alert.pool,
                summary=alert.summary,
                description=alert.description,
            )
            if self._on_change:
                self._on_change(alert, True)
        self._active[alert.key] = (alert, since)

    def event(self, alert: Alert, now: float) -> None:
        """A one-off happening, firing for ``event_ttl_s``."""
        log.warning(
            "alert event",
            alertname=alert.name,
            replica=alert.replica,
            pool=alert.pool,
            summary=alert.summary,
            description=alert.description,
            **dict(alert.extra),
        )
        ends_at = now + self._settings.event_ttl_s
        self._events.pop(alert.key, None)  # the newest goes last: the oldest leave first
        self._events[alert.key] = (to_alertmanager(alert, starts_at=now, ends_at=ends_at), ends_at)
        while len(self._events) > self._settings.keep_events:
            del self._events[next(iter(self._events))]

    def forget(self, replica: str, now: float) -> None:
        """The replica is gone: its conditions resolve and its events end, now."""
        for key, (alert, since) in list(self._active.items()):
            if alert.replica == replica:
                self._resolve(key, alert, since, now)
        self._seen = {key for key in self._seen if key[1] != replica}
        for key in [key for key in self._events if key[1] == replica]:
            payload, _ = self._events.pop(key)
            self._resolved.append({**payload, "endsAt": _iso(now)})

    def _resolve(self, key: tuple[str, str, str], alert: Alert, since: float, now: float) -> None:
        del self._active[key]
        log.info("alert resolved", alertname=alert.name, replica=alert.replica, pool=alert.pool)
        if self._on_change:
            self._on_change(alert, False)
        self._resolved.append(to_alertmanager(alert, starts_at=since, ends_at=now))

    def flush(
        self, now: float, *, checked: Callable[[tuple[str, str, str]], bool] | None = None
    ) -> None:
        """End of cycle: resolve the conditions that were checked but not seen; send all.

        ``checked(key)`` False means "not re-evaluated this cycle" (e.g. the replica had no
        data): such alerts stay as they are.
        """
        firing = []
        for key, (alert, since) in list(self._active.items()):
            if key in self._seen or (checked is not None and not checked(key)):
                ends_at = now + self._condition_ttl_s
                firing.append(to_alertmanager(alert, starts_at=since, ends_at=ends_at))
            else:
                self._resolve(key, alert, since, now)
        self._seen = set()
        self._events = {key: ev for key, ev in self._events.items() if ev[1] > now}
        if self._poster is None:
            self._resolved = []
            return
        batch = [*firing, *self._resolved, *(payload for payload, _ in self._events.values())]
        if not batch:
            return
        try:
            self._poster(batch)
        except TemporaryError as error:
            self.send_errors += 1
            log.error("alertmanager unreachable; alerts kept for the next cycle", error=str(error))
            self._resolved = self._resolved[-UNSENT_RESOLUTIONS:]  # bounded: oldest dropped
            return
        self._resolved = []
