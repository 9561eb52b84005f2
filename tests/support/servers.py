"""Real Prometheus and Alertmanager (Debian's binaries) for integration tests.

Each server runs as a subprocess on a free port of 127.0.0.1, with its config and data in a
folder the caller gives (pytest's ``tmp_path``); the context managers wait until the server is
ready and always terminate it. A missing binary skips the test, unless the environment sets
``TABLETUNE_REQUIRE_SERVERS=1`` (CI does): then it fails, so CI cannot go green by skipping.

    with prometheus(tmp_path, targets=["127.0.0.1:8000"]) as prom:
        prom.wait_for_targets_up()
        value = prom.query_value("sum(vllm:spec_decode_num_drafts_total)")
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tabletune.admin.auth import OPEN_ENV, OPEN_LOOPBACK
from tabletune.metric_names import VLLM_NAME_RELABEL

REQUIRE_ENV = "TABLETUNE_REQUIRE_SERVERS"
PROMETHEUS_BINARY = "prometheus"
ALERTMANAGER_BINARY = "prometheus-alertmanager"
START_TIMEOUT_S = 30.0


# Ports this process has handed out: once closed, the OS may give the same one to the next
# bind (in CI a daemon's port, taken first, came back as its emulator's).
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1, and not handed out before here."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def servers_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") == "1"


def require_binary(name: str) -> str:
    """Path of ``name``; skip the test when it is missing, or fail when servers are required."""
    path = shutil.which(name)
    if path is not None:
        return path
    message = f"{name} is not installed (apt-get install {name})"
    if servers_required():
        pytest.fail(f"{message}, and {REQUIRE_ENV}=1 requires it")
    pytest.skip(message)


def _log_tail(log_path: Path, lines: int = 30) -> str:
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def poll_until(predicate: Any, *, timeout_s: float, what: str) -> Any:
    """Poll ``predicate()`` every 0.1 s until it returns something truthy; that value is
    returned. TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout_s} s")
        time.sleep(0.1)


def wait_until_ready(
    url: str,
    process: subprocess.Popen[bytes],
    log_path: Path,
    *,
    timeout_s: float = START_TIMEOUT_S,
) -> None:
    """Poll ``url`` until it answers 200; fail early (with the log) if the process exits."""
    deadline = time.monotonic() + timeout_s
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"{process.args[0]} exited with {process.returncode} before it was ready:\n"
                f"{_log_tail(log_path)}"
            )
        try:
            response = httpx.get(url, timeout=1.0)
            if response.status_code == 200:
                return
            last_error = f"HTTP {response.status_code}"
        except httpx.HTTPError as error:
            last_error = f"{type(error).__name__}: {error}"
        time.sleep(0.05)
    raise RuntimeError(
        f"{url} not ready after {timeout_s:.0f} s ({last_error}):\n{_log_tail(log_path)}"
    )


def terminate(process: subprocess.Popen[bytes], *, timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it does not exit in time."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout_s)


@contextmanager
def running(
    command: Sequence[str],
    *,
    ready_url: str,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float = START_TIMEOUT_S,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``command`` (output to ``log_path``), wait for ``ready_url``, always terminate."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(command),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env},
            cwd=cwd,
        )
        try:
            wait_until_ready(ready_url, process, log_path, timeout_s=timeout_s)
            yield process
        finally:
            terminate(process)


class TextServer:
    """A /metrics look-alike on 127.0.0.1:``port``, in a thread until ``stop``: every GET is
    answered with ``page(path)`` in Prometheus's text format (the path carries any query)."""

    def __init__(self, port: int, page: Callable[[str], bytes]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = page(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class QueryError(RuntimeError):
    """Prometheus refused or failed a query."""


@dataclass
class PrometheusServer:
    """A running Prometheus: its URL and a few query helpers (HTTP API v1)."""

    url: str
    port: int
    config_path: Path
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    def _get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        response = httpx.get(f"{self.url}{path}", params=params, timeout=10.0)
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise QueryError(f"{path} {params}: HTTP {response.status_code}: {body}")
        return body["data"]

    def query(self, expr: str, *, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query: the ``result`` list of a vector (each {"metric": ..., "value": ...})."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        data = self._get("/api/v1/query", params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_value(self, expr: str, *, at: float | None = None) -> float | None:
        """The single value of a one-element result; None when the result is empty."""
        result = self.query(expr, at=at)
        if not result:
            return None
        if len(result) > 1:
            raise QueryError(f"{expr!r} returned {len(result)} series, expected one")
        return float(result[0]["value"][1])

    def query_range(
        self, expr: str, *, start: float, end: float, step: float = 1.0
    ) -> list[dict[str, Any]]:
        params = {"query": expr, "start": start, "end": end, "step": step}
        result: list[dict[str, Any]] = self._get("/api/v1/query_range", params)["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self._get("/api/v1/targets")["activeTargets"]
        return active

    def alerts(self) -> list[dict[str, Any]]:
        """Alerts as Prometheus sees them (pending and firing)."""
        alerts: list[dict[str, Any]] = self._get("/api/v1/alerts")["alerts"]
        return alerts

    def wait_for(self, predicate: Any, *, timeout_s: float = 20.0, what: str = "condition") -> Any:
        """Poll ``predicate()`` until it returns something truthy; that value is returned."""
        return poll_until(predicate, timeout_s=timeout_s, what=f"{what} (Prometheus at {self.url})")

    def wait_for_targets_up(self, *, count: int | None = None, timeout_s: float = 20.0) -> None:
        """Wait until every target (at least ``count``) has been scraped successfully."""

        def all_up() -> bool:
            active = self.targets()
            enough = len(active) >= (count if count is not None else 1)
            return enough and all(t.get("health") == "up" for t in active)

        self.wait_for(all_up, timeout_s=timeout_s, what="targets up")

    def wait_for_samples(self, expr: str, *, minimum: int, timeout_s: float = 20.0) -> None:
        """Wait until every series of ``expr`` holds ``minimum`` samples: raw samples when
        ``expr`` is a series selector, else points of a subquery at the evaluation interval."""

        def counts() -> list[dict[str, Any]]:
            try:
                return self.query(f"count_over_time({expr}[1h])")
            except QueryError:  # not a plain selector
                return self.query(f"count_over_time(({expr})[1h:])")

        def enough() -> bool:
            result = counts()
            return bool(result) and all(float(r["value"][1]) >= minimum for r in result)

        self.wait_for(enough, timeout_s=timeout_s, what=f"{minimum} samples of {expr}")

    def reload(self) -> None:
        """Re-read the config file (needs --web.enable-lifecycle, which we always set)."""
        response = httpx.post(f"{self.url}/-/reload", timeout=10.0)
        if response.status_code != 200:
            raise QueryError(f"reload failed: HTTP {response.status_code}: {response.text}")


def prometheus_config(
    targets: Sequence[str],
    *,
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    job: str = "vllm",
    rule_files: Sequence[Path | str] = (),
    alertmanager: str | None = None,
    scrape_timeout: str | None = None,
    extra_scrape_configs: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The config as a dict: one static job over ``targets`` ("host:port")."""
    job_config: dict[str, Any] = {
        "job_name": job,
        "static_configs": [{"targets": list(targets)}],
        # as the shipped config does: vLLM's names whatever exposition format was negotiated
        "metric_relabel_configs": [VLLM_NAME_RELABEL],
    }
    if scrape_timeout is not None:
        job_config["scrape_timeout"] = scrape_timeout
    config: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
        "scrape_configs": [job_config, *[dict(c) for c in extra_scrape_configs]],
    }
    if rule_files:
        config["rule_files"] = [str(Path(p).resolve()) for p in rule_files]
    if alertmanager is not None:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return config


@contextmanager
def prometheus(
    workdir: Path,
    targets: Sequence[str] = (),
    *,
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    job: str = "vllm",
    rule_files: Sequence[Path | str] = (),
    alertmanager: str | None = None,
    scrape_timeout: str | None = None,
    extra_scrape_configs: Sequence[Mapping[str, Any]] = (),
    config: Mapping[str, Any] | None = None,
    resend_delay: str = "1s",
    timeout_s: float = START_TIMEOUT_S,
) -> Iterator[PrometheusServer]:
    """A real Prometheus scraping ``targets`` (or running the whole ``config`` given).

    ``resend_delay`` is short because Prometheus drops the first notification when it fires
    before the Alertmanager is discovered and would otherwise resend only after a minute."""
    binary = require_binary(PROMETHEUS_BINARY)
    port = free_port()
    base = workdir / f"prometheus-{port}"
    base.mkdir(parents=True, exist_ok=True)
    config_path = base / "prometheus.yml"
    data_dir = base / "data"
    log_path = base / "prometheus.log"
    if config is None:
        config = prometheus_config(
            targets,
            scrape_interval=scrape_interval,
            evaluation_interval=evaluation_interval,
            job=job,
            rule_files=rule_files,
            alertmanager=alertmanager,
            scrape_timeout=scrape_timeout,
            extra_scrape_configs=extra_scrape_configs,
        )
    config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
    url = f"http://127.0.0.1:{port}"
    command = [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={data_dir}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
        f"--rules.alert.resend-delay={resend_delay}",
        "--log.level=warn",
    ]
    with running(
        command, ready_url=f"{url}/-/ready", log_path=log_path, timeout_s=timeout_s
    ) as process:
        yield PrometheusServer(
            url=url,
            port=port,
            config_path=config_path,
            data_dir=data_dir,
            log_path=log_path,
            process=process,
        )


@dataclass
class AlertmanagerServer:
    """A running Alertmanager: its URL, ``host:port`` for Prometheus, and the alerts it holds."""

    url: str
    port: int
    config_path: Path
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alerts(self, *, active_only: bool = True) -> list[dict[str, Any]]:
        params = {"active": "true"} if active_only else None
        response = httpx.get(f"{self.url}/api/v2/alerts", params=params, timeout=10.0)
        response.raise_for_status()
        alerts: list[dict[str, Any]] = response.json()
        return alerts

    def alert_names(self) -> set[str]:
        return {a["labels"].get("alertname", "") for a in self.alerts()}

    def wait_for_alert(self, name: str, *, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            for alert in self.alerts():
                if alert["labels"].get("alertname") == name:
                    return alert
            if time.monotonic() > deadline:
                raise TimeoutError(f"alert {name!r} not in Alertmanager after {timeout_s} s")
            time.sleep(0.1)


def alertmanager_config(webhook_url: str | None = None) -> dict[str, Any]:
    """One route to one receiver (a webhook when given), grouped fast enough for tests."""
    receiver: dict[str, Any] = {"name": "default"}
    if webhook_url is not None:
        receiver["webhook_configs"] = [{"url": webhook_url, "send_resolved": True}]
    return {
        "route": {
            "receiver": "default",
            "group_by": ["alertname"],
            "group_wait": "0s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [receiver],
    }


@contextmanager
def alertmanager(
    workdir: Path,
    *,
    webhook_url: str | None = None,
    config: Mapping[str, Any] | None = None,
    timeout_s: float = START_TIMEOUT_S,
    port: int | None = None,
) -> Iterator[AlertmanagerServer]:
    """A real Alertmanager (clustering off) on a free port (or ``port``: a restart)."""
    binary = require_binary(ALERTMANAGER_BINARY)
    port = port or free_port()
    base = workdir / f"alertmanager-{port}"
    base.mkdir(parents=True, exist_ok=True)
    config_path = base / "alertmanager.yml"
    log_path = base / "alertmanager.log"
    if config is None:
        config = alertmanager_config(webhook_url)
    config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
    url = f"http://127.0.0.1:{port}"
    command = [
        binary,
        f"--config.file={config_path}",
        f"--storage.path={base / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    with running(
        command, ready_url=f"{url}/-/ready", log_path=log_path, timeout_s=timeout_s
    ) as process:
        yield AlertmanagerServer(
            url=url, port=port, config_path=config_path, log_path=log_path, process=process
        )


def python_command(*args: str) -> list[str]:
    """Run a module with the interpreter running the tests (the project's venv)."""
    return [sys.executable, *args]


def free_port_range(count: int, *, attempts: int = 50) -> list[int]:
    """``count`` consecutive ports that were all free a moment ago."""
    import random

    for _ in range(attempts):
        base = random.randint(20_000, 60_000 - count)
        ports = range(base, base + count)
        if _HANDED_OUT.intersection(ports):
            continue
        sockets: list[socket.socket] = []
        try:
            for port in ports:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            _HANDED_OUT.update(ports)
            return list(ports)
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports found")


@dataclass
class SimServer:
    """A running ``tabletune sim serve``: one engine per port."""

    ports: list[int]
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def targets(self) -> list[str]:
        """``host:port`` of each engine, for a Prometheus scrape config."""
        return [f"127.0.0.1:{p}" for p in self.ports]


@contextmanager
def sim_server(
    workdir: Path,
    scenario: str | Path,
    *,
    replicas: int = 1,
    speed: float = 1.0,
    profile: str | Path | None = None,
    timeout_s: float = START_TIMEOUT_S,
) -> Iterator[SimServer]:
    """The engine emulator as users run it (the CLI, in a subprocess), on free ports."""
    ports = free_port_range(replicas) if replicas > 1 else [free_port()]
    command = python_command(
        "-m", "tabletune.cli.main", "sim", "serve", "--scenario", str(scenario),
        "--speed", str(speed),
    )  # fmt: skip
    command += (
        ["--port", str(ports[0])] if replicas == 1 else ["--ports", f"{ports[0]}-{ports[-1]}"]
    )
    if profile is not None:
        command += ["--profile", str(profile)]
    log_path = workdir / f"sim-{ports[0]}.log"
    with running(
        command,
        ready_url=f"http://127.0.0.1:{ports[-1]}/health",
        log_path=log_path,
        env={OPEN_ENV: OPEN_LOOPBACK},  # the tests' own clients write from this machine
        timeout_s=timeout_s,
    ) as process:
        yield SimServer(ports=ports, log_path=log_path, process=process)
