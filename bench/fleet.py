"""Helpers for benchmarks that run the real ``tabletune daemon`` process against emulator
processes (``tabletune sim serve --ports A-B``): start and stop them, read the daemon's JSON log,
its /metrics and /healthz, its memory and CPU. Used by ``fleet_bench.py`` and ``soak.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.sim_scale import cpu_seconds, rss_mib
from tabletune.admin.auth import OPEN_ENV, OPEN_LOOPBACK
from tabletune.metric_names import VLLM_NAME_RELABEL

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "examples" / "sample-profile.json"
# The demo's scenario: the load starts where the engines' starting table runs k=0, so the
# daemon pushes to every replica on its second cycle (first sight).
SCENARIO = ROOT / "src" / "tabletune" / "demo" / "scenario.yaml"


def wait_for(predicate: Any, *, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout_s} s")
        time.sleep(0.2)


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Emulator:
    """One ``tabletune sim serve`` process: one engine per port."""

    ports: list[int]
    process: subprocess.Popen[bytes]

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def stop(self) -> None:
        """Gone at once, as a deleted pod (its hung answers would hold a graceful stop)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start_emulator(
    ports: list[int], log_path: Path, *, scenario: Path = SCENARIO, speed: float = 1.0
) -> Emulator:
    command = [
        sys.executable, "-m", "tabletune.cli.main", "sim", "serve", "--scenario", str(scenario),
        "--ports", f"{ports[0]}-{ports[-1]}", "--speed", f"{speed:g}", "--profile", str(PROFILE),
    ]  # fmt: skip
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, OPEN_ENV: OPEN_LOOPBACK},
        )
    emulator = Emulator(ports, process)
    wait_for(
        lambda: answers(f"{emulator.urls[-1]}/health") and answers(f"{emulator.urls[0]}/health"),
        timeout_s=120,
        what="emulator",
    )
    return emulator


def set_faults(url: str, **faults: object) -> None:
    httpx.post(f"{url}/sim/v1/faults", json=faults, timeout=10.0).raise_for_status()


@dataclass
class Daemon:
    """A running ``tabletune daemon`` process with its JSON log and its own HTTP server."""

    process: subprocess.Popen[bytes]
    base: str
    log_path: Path
    started: float = field(default_factory=time.time)

    @property
    def pid(self) -> int:
        return self.process.pid

    def events(self, *names: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # counted by broken_log_lines
                if not names or entry.get("event") in names:
                    out.append(entry)
        return out

    def broken_log_lines(self) -> int:
        """Lines of the JSON log that are not one JSON record (two records on a line, say)."""
        broken = 0
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                json.loads(line)
            except json.JSONDecodeError:
                broken += 1
        return broken

    def cycles(self) -> list[dict[str, Any]]:
        return self.events("cycle done")

    def cycle_starts(self) -> list[float]:
        return [stamp(e) - e["seconds"] for e in self.cycles()]

    def healthz(self) -> int:
        try:
            return httpx.get(f"{self.base}/healthz", timeout=5.0).status_code
        except httpx.HTTPError:
            return 0

    def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        """Every sample of the daemon's /metrics: (name, labels, value)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.base}/metrics", timeout=10.0).text
        return [
            (s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]

    def rss_mib(self) -> float:
        return rss_mib(self.pid)

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_s(self) -> float:
        return cpu_seconds(self.pid)

    def stop(self) -> tuple[float, int]:
        """SIGTERM; seconds until it exited, and its exit code."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        return time.monotonic() - started, code


def start_daemon(workdir: Path, port: int, **env: str) -> Daemon:
    """``env``: TABLETUNE_* settings without the prefix (``LOOP__INTERVAL_S="15"``)."""
    settings = {
        "TABLETUNE_PROFILE__PATHS": str(PROFILE),
        "TABLETUNE_STATE__DIR": str(workdir / "state"),
        "TABLETUNE_SERVER__PORT": str(port),
        **{f"TABLETUNE_{key}": value for key, value in env.items()},
    }
    log_path = workdir / "daemon.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tabletune.cli.main", "daemon"],
            env={**os.environ, **settings},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    daemon = Daemon(process, f"http://127.0.0.1:{port}", log_path)
    wait_for(lambda: daemon.healthz() == 200, timeout_s=60, what="daemon /healthz")
    return daemon


@dataclass
class Alertmanager:
    """A real Alertmanager (Debian's ``prometheus-alertmanager``), clustering off."""

    port: int
    workdir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it (again: alerts live in its memory only, so a restart forgets them)."""
        config = self.workdir / "alertmanager.yml"
        config.write_text(
            "route: {receiver: default, group_by: [alertname], group_wait: 0s, "
            "group_interval: 1s, repeat_interval: 1h}\nreceivers: [{name: default}]\n"
        )
        with (self.workdir / "alertmanager.log").open("ab") as log:
            self.process = subprocess.Popen(
                [
                    "prometheus-alertmanager",
                    f"--config.file={config}",
                    f"--storage.path={self.workdir / 'am-data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--cluster.listen-address=",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(lambda: answers(f"{self.url}/-/ready"), timeout_s=60, what="Alertmanager")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)

    def alerts(self) -> list[dict[str, Any]]:
        """The active alerts it holds."""
        response = httpx.get(f"{self.url}/api/v2/alerts", params={"active": "true"}, timeout=10)
        response.raise_for_status()
        alerts: list[dict[str, Any]] = response.json()
        return alerts


@dataclass
class Prometheus:
    """A real Prometheus scraping ``targets`` ("host:port"); restarted on the same port and
    database, as a restarted server would be."""

    port: int
    workdir: Path
    targets: list[str]
    scrape_interval: str = "2s"
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        config = self.workdir / "prometheus.yml"
        job = {
            "job_name": "vllm",
            "static_configs": [{"targets": self.targets}],
            "metric_relabel_configs": [VLLM_NAME_RELABEL],
        }
        settings = {"global": {"scrape_interval": self.scrape_interval}, "scrape_configs": [job]}
        config.write_text(json.dumps(settings))  # JSON is YAML
        with (self.workdir / "prometheus.log").open("ab") as log:
            self.process = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.workdir / 'prom-data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(lambda: answers(f"{self.url}/-/ready"), timeout_s=60, what="Prometheus")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def stamp(entry: dict[str, Any]) -> float:
    return datetime.fromisoformat(entry["timestamp"]).timestamp()
