"""Alerts: Alertmanager v2 shapes, conditions that resolve, events with a TTL, outages kept."""

from __future__ import annotations

import json

import httpx
import pytest

from tabletune.daemon import alerts as names
from tabletune.daemon.alerts import Alert, AlertmanagerClient, AlertSink, to_alertmanager
from tabletune.daemon.settings import load_settings
from tabletune.errors import TemporaryError

SETTINGS = load_settings({"TABLETUNE_ALERTS__EVENT_TTL_S": "600"}).alerts


def test_postable_alert_shape() -> None:
    alert = Alert(
        names.ROLLBACK,
        "rolled back",
        "why",
        replica="r1",
        pool="p",
        extra={"old_table": "[[1,8,3]]"},
    )
    body = to_alertmanager(alert, starts_at=0.0, ends_at=60.0)
    assert body["labels"] == {
        "alertname": "TableTuneRollback",
        "severity": "critical",
        "replica": "r1",
        "pool": "p",
    }
    assert body["annotations"] == {
        "summary": "rolled back",
        "description": "why",
        "old_table": "[[1,8,3]]",
    }
    assert body["startsAt"] == "1970-01-01T00:00:00Z"
    assert body["endsAt"] == "1970-01-01T00:01:00Z"


def test_condition_fires_is_resent_then_resolves() -> None:
    sent: list[list[dict[str, object]]] = []
    changes: list[tuple[str, bool]] = []
    sink = AlertSink(
        settings=SETTINGS,
        condition_ttl_s=120,
        poster=sent.append,
        on_change=lambda a, firing: changes.append((a.name, firing)),
    )
    stale = Alert(names.STALE_DATA, "no data", replica="r1")
    sink.condition(stale, 1000.0)
    sink.flush(1000.0)
    sink.condition(stale, 1015.0)
    sink.flush(1015.0)
    sink.flush(1030.0)  # not seen: resolved
    assert [a["endsAt"] for batch in sent for a in batch] == [
        "1970-01-01T00:18:40Z",  # 1000 + 120
        "1970-01-01T00:18:55Z",  # 1015 + 120
        "1970-01-01T00:17:10Z",  # resolved at 1030
    ]
    assert all(a["startsAt"] == "1970-01-01T00:16:40Z" for batch in sent for a in batch)
    assert changes == [(names.STALE_DATA, True), (names.STALE_DATA, False)]
    assert sink.active == {}


def test_unchecked_conditions_stay_firing() -> None:
    sink = AlertSink(settings=SETTINGS, condition_ttl_s=120)
    sink.condition(Alert(names.PROFILE_DRIFT, "slow", replica="r2"), 0.0)
    sink.flush(0.0)
    sink.flush(15.0, checked=lambda key: key[1] != "r2")
    assert (names.PROFILE_DRIFT, "r2", "") in sink.active


def test_events_are_resent_until_they_end() -> None:
    # An Alertmanager that restarted meanwhile (alerts live in its memory) gets them again;
    # re-sending the same alert is a no-op for one that kept it.
    sent: list[list[dict[str, object]]] = []
    sink = AlertSink(settings=SETTINGS, condition_ttl_s=120, poster=sent.append)
    sink.event(Alert(names.TABLE_SHIFTED, "changed", replica="r1"), 0.0)
    sink.flush(0.0)
    assert sent[0][0]["endsAt"] == "1970-01-01T00:10:00Z"
    sink.flush(15.0)
    sink.flush(599.0)
    assert sent == [sent[0]] * 3  # the very same alert
    sink.flush(600.0)
    assert len(sent) == 3 and sink.events == {}  # ended: no longer sent


class FlakyAlertmanager:
    """A poster that refuses while ``down`` and records what it is sent after."""

    def __init__(self) -> None:
        self.down = True
        self.sent: list[list[dict[str, object]]] = []

    def __call__(self, batch: list[dict[str, object]]) -> None:
        if self.down:
            raise TemporaryError("connection refused")
        self.sent.append(batch)


def test_unreachable_alertmanager_keeps_alerts_for_next_flush() -> None:
    am = FlakyAlertmanager()
    sink = AlertSink(settings=SETTINGS, condition_ttl_s=120, poster=am)
    sink.event(Alert(names.ROLLBACK, "rolled back", replica="r1"), 0.0)
    sink.flush(0.0)
    assert sink.send_errors == 1
    am.down = False
    sink.flush(15.0)
    assert [a["labels"]["alertname"] for a in am.sent[0]] == [names.ROLLBACK]  # type: ignore[index]


def test_client_posts_v2_with_auth() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200 if len(seen) == 1 else 500, text="boom")

    settings = load_settings(
        {
            "TABLETUNE_ALERTS__ALERTMANAGER_URL": "http://am:9093/",
            "TABLETUNE_ALERTS__USERNAME": "ops",
            "TABLETUNE_ALERTS__PASSWORD": "pw",
        }
    ).alerts
    client = AlertmanagerClient(settings=settings, transport=httpx.MockTransport(handler))
    client.post([{"labels": {"alertname": "X"}}])
    assert str(seen[0].url) == "http://am:9093/api/v2/alerts"
    assert seen[0].headers["authorization"].startswith("Basic ")
    assert json.loads(seen[0].content) == [{"labels": {"alertname": "X"}}]
    with pytest.raises(TemporaryError, match="HTTP 500"):
        client.post([])


def test_an_event_replaces_the_older_one_of_its_label_set_and_the_newest_are_kept() -> None:
    settings = load_settings({"TABLETUNE_ALERTS__KEEP_EVENTS": "2"}).alerts
    sent: list[list[dict[str, object]]] = []
    sink = AlertSink(settings=settings, condition_ttl_s=120, poster=sent.append)
    sink.event(Alert(names.TABLE_SHIFTED, "first", replica="r1"), 0.0)
    sink.event(Alert(names.TABLE_SHIFTED, "second", replica="r1"), 10.0)
    sink.event(Alert(names.TABLE_SHIFTED, "other", replica="r2"), 20.0)
    sink.event(Alert(names.ROLLBACK, "newest", replica="r3"), 30.0)
    sink.flush(30.0)
    summaries = [a["annotations"]["summary"] for a in sent[0]]  # type: ignore[index]
    assert summaries == ["other", "newest"]  # r1's two: one label set, and the oldest left


def test_events_and_resolutions_wait_out_an_alertmanager_outage() -> None:
    am = FlakyAlertmanager()
    sink = AlertSink(settings=SETTINGS, condition_ttl_s=120, poster=am)
    sink.condition(Alert(names.STALE_DATA, "no data", replica="r1"), 0.0)
    sink.event(Alert(names.TABLE_SHIFTED, "changed", replica="r2"), 0.0)
    sink.flush(0.0)
    sink.flush(15.0)  # r1's condition resolved while Alertmanager is down
    am.down = False
    sink.flush(30.0)
    sink.flush(45.0)
    first, second = am.sent
    assert [(a["labels"]["alertname"], a["endsAt"]) for a in first] == [  # type: ignore[index]
        (names.STALE_DATA, "1970-01-01T00:00:15Z"),  # the resolution, delivered late
        (names.TABLE_SHIFTED, "1970-01-01T00:10:00Z"),
    ]
    assert second == [first[1]]  # the event again; the resolution once


def test_forgetting_a_replica_ends_its_alerts_now() -> None:
    sent: list[list[dict[str, object]]] = []
    changes: list[tuple[str, str, bool]] = []
    sink = AlertSink(
        settings=SETTINGS,
        condition_ttl_s=120,
        poster=sent.append,
        on_change=lambda a, firing: changes.append((a.name, a.replica, firing)),
    )
    sink.condition(Alert(names.STALE_DATA, "no data", replica="gone"), 0.0)
    sink.condition(Alert(names.PUSH_FAILED, "cannot push", replica="gone", pool="p"), 0.0)
    sink.condition(Alert(names.STALE_DATA, "no data", replica="other"), 0.0)
    sink.flush(0.0)
    sink.event(Alert(names.TABLE_SHIFTED, "changed", replica="gone"), 300.0)  # ends at 900
    sink.flush(300.0, checked=lambda key: False)
    sink.forget("gone", 600.0)
    # Not re-judged this cycle (no data) and still nothing to say about "gone": resolved anyway.
    sink.flush(600.0, checked=lambda key: False)
    assert set(sink.active) == {(names.STALE_DATA, "other", "")}
    resolved = [
        (a["labels"]["alertname"], a["endsAt"])  # type: ignore[index]
        for a in sent[-1]
        if a["labels"].get("replica") == "gone"  # type: ignore[attr-defined]
    ]
    assert sorted(resolved) == [
        (names.PUSH_FAILED, "1970-01-01T00:10:00Z"),
        (names.STALE_DATA, "1970-01-01T00:10:00Z"),
        (names.TABLE_SHIFTED, "1970-01-01T00:10:00Z"),  # ends now, not at 15 min
    ]
    assert sink.events == {}
    assert sorted(c for c in changes if not c[2]) == [
        (names.PUSH_FAILED, "gone", False),
        (names.STALE_DATA, "gone", False),
    ]
