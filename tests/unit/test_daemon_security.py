"""The daemon's small exposures: its state file's mode, a busy /metrics port, library log lines
outside the JSON format, ``--once`` reporting ok with nothing done, and its admin token."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from apscheduler.events import EVENT_JOB_ERROR, JobExecutionEvent
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry

from tabletune.daemon import logs
from tabletune.daemon.controller import CycleReport
from tabletune.daemon.metrics import MetricsServer
from tabletune.daemon.service import OnceOutcome, build_daemon, once_problem, report_json, run_once
from tabletune.daemon.settings import load_settings
from tabletune.daemon.state import STATE_FILE_MODE, DaemonState, StateStore
from tabletune.errors import InputError

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "examples" / "sample-profile.json"
TOKEN = "daemon-0123456789abcdef"


# --- the state file -----------------------------------------------------------------------


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0o022)  # a umask that would leave a new file world-readable
    try:
        yield
    finally:
        os.umask(old)


def test_a_new_state_file_is_owner_only(tmp_path: Path, open_umask: None) -> None:
    store = StateStore(tmp_path)
    store.save(DaemonState())
    assert stat.S_IMODE(store.path.stat().st_mode) == STATE_FILE_MODE == 0o600


def test_an_existing_state_files_mode_is_kept(tmp_path: Path, open_umask: None) -> None:
    store = StateStore(tmp_path)
    store.save(DaemonState())
    store.path.chmod(0o640)  # an operator let a group read it
    store.save(DaemonState(saved_at=1.0))
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o640
    assert store.load()[0].saved_at == 1.0


# --- /metrics port ------------------------------------------------------------------------


def test_a_busy_metrics_port_is_a_configuration_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InputError) as caught:
            MetricsServer(
                registry=CollectorRegistry(), healthy=lambda: True, host="127.0.0.1", port=port
            )
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message and "TABLETUNE_SERVER__PORT" in message
    assert "\n" not in message


# --- logs -----------------------------------------------------------------------------------


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    logs.configure(level="info", fmt="json", stream=stream)
    try:
        yield stream
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_apscheduler_lines_are_json(log_stream: io.StringIO) -> None:
    failed = threading.Event()

    def job() -> None:
        raise RuntimeError("boom")

    def on_error(event: JobExecutionEvent) -> None:
        failed.set()

    scheduler = BackgroundScheduler()
    scheduler.add_listener(on_error, EVENT_JOB_ERROR)
    scheduler.add_job(job, "date", id="broken")  # runs now
    scheduler.start()
    try:
        assert failed.wait(timeout=30)
    finally:
        scheduler.shutdown(wait=True)
    [line] = [entry for entry in _lines(log_stream) if entry["level"] == "error"]
    assert line["logger"] == "apscheduler.executors.default"
    assert "raised an exception" in str(line["event"]) and line["timestamp"]
    assert "boom" in json.dumps(line["exception"])  # the traceback as structured data


def test_library_chatter_stays_out_but_our_info_is_in(log_stream: io.StringIO) -> None:
    logging.getLogger("httpx").info("HTTP Request: GET http://x/metrics 200 OK")
    logging.getLogger("apscheduler.scheduler").warning("Run time of job was missed by 0:00:05")
    import structlog

    structlog.get_logger("tabletune.daemon").info("cycle done", observed=1)
    lines = _lines(log_stream)
    assert [line["event"] for line in lines] == [
        "Run time of job was missed by 0:00:05",
        "cycle done",
    ]
    assert lines[0]["level"] == "warning" and lines[0]["logger"] == "apscheduler.scheduler"


def test_configure_twice_keeps_one_library_handler(log_stream: io.StringIO) -> None:
    logs.configure(level="info", fmt="json", stream=log_stream)
    logging.getLogger("apscheduler").warning("once")
    assert [line["event"] for line in _lines(log_stream)] == ["once"]


# --- --once ---------------------------------------------------------------------------------


def test_once_says_why_it_did_nothing() -> None:
    assert once_problem(None, saved=True) is not None
    outage = CycleReport(started=0.0, outage="prometheus: connection refused")
    assert once_problem(outage, saved=True) == (
        "no replica observed (prometheus: connection refused)"
    )
    stale = CycleReport(started=0.0, problems={"http://a:8000": "scrape failed"})
    assert "http://a:8000: scrape failed" in str(once_problem(stale, saved=True))
    assert "none found" in str(once_problem(CycleReport(started=0.0), saved=True))
    ok = CycleReport(started=0.0, observed=["http://a:8000"])
    assert once_problem(ok, saved=False) == "the state could not be saved (see the log)"
    assert once_problem(ok, saved=True) is None


def test_report_is_not_ok_when_there_is_a_problem() -> None:
    report = CycleReport(started=0.0)
    body = json.loads(report_json(OnceOutcome(report, "no replica observed (none found)")))
    assert body["ok"] is False and body["problem"] == "no replica observed (none found)"
    assert json.loads(report_json(OnceOutcome(None, "the cycle failed")))["ok"] is False


def _settings(tmp_path: Path, **env: str) -> dict[str, str]:
    return {
        "TABLETUNE_SOURCE__REPLICAS": "http://127.0.0.1:9",  # nothing listens there
        "TABLETUNE_PROFILE__PATHS": str(PROFILE),
        "TABLETUNE_STATE__DIR": str(tmp_path / "state"),
        "TABLETUNE_SOURCE__TIMEOUT_S": "1",
        **env,
    }


def test_once_with_no_replica_answering_is_a_failure(tmp_path: Path) -> None:
    daemon = build_daemon(load_settings(_settings(tmp_path)))
    try:
        outcome = run_once(daemon, sleep=lambda seconds: None)
    finally:
        daemon.close()
    assert outcome.report is not None and outcome.report.observed == []
    assert outcome.problem is not None and "no replica observed" in outcome.problem
    assert "127.0.0.1:9" in outcome.problem


# --- the admin token ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"TABLETUNE_ADMIN_TOKEN": "change-me"}, "placeholder"),
        ({"TABLETUNE_ADMIN_TOKEN": "short"}, "shorter"),
        ({"TABLETUNE_ADMIN__TOKEN": "change-me"}, "placeholder"),  # the old name too
        ({"TABLETUNE_ADMIN_TOKEN_FILE": "/nonexistent/admin-token"}, "cannot read"),
        ({"TABLETUNE_ADMIN_TOKEN": TOKEN, "TABLETUNE_ADMIN_TOKEN_FILE": "/x"}, "not both"),
    ],
)
def test_an_unusable_token_stops_the_daemon(
    tmp_path: Path, env: dict[str, str], words: str
) -> None:
    with pytest.raises(InputError) as caught:
        build_daemon(load_settings(_settings(tmp_path, **env)))
    assert words in str(caught.value) and "TABLETUNE_ADMIN_TOKEN" in str(caught.value)
    assert "change-me" not in str(caught.value)


def test_the_token_file_is_what_the_daemon_sends(tmp_path: Path) -> None:
    path = tmp_path / "admin-token"
    path.write_text(TOKEN + "\n")
    daemon = build_daemon(load_settings(_settings(tmp_path, TABLETUNE_ADMIN_TOKEN_FILE=str(path))))
    try:
        client = daemon.controller.admin_for("http://127.0.0.1:9")
        assert client._headers["Authorization"] == f"Bearer {TOKEN}"
    finally:
        daemon.close()
