"""The daemon's whole loop against real servers: the emulator (vLLM + plugin look-alike, its
ground truth as the judge), a real Prometheus scraping it, a real Alertmanager receiving the
daemon's alerts. The emulator runs 20x faster than real time to keep each test to seconds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tabletune.daemon.service import Daemon, build_daemon
from tabletune.daemon.settings import load_settings
from tabletune.demo.emulator import emulator
from tests.support.servers import (
    AlertmanagerServer,
    PrometheusServer,
    alertmanager,
    prometheus,
    running,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "examples" / "sample-profile.json"
# The fast profiler's H200 profile: its cells say which ran off the full CUDA graph.
H200_INFLIGHT = ROOT / "profiles" / "h200-qwen3-4b-eagle3-inflight.json"
SPEED = 20.0
CYCLE_WALL_S = 0.5  # 10 simulated seconds between cycles


@dataclass
class Rig:
    sim: str
    prom: PrometheusServer
    am: AlertmanagerServer
    daemon: Daemon
    target: str
    stack: ExitStack

    def truth(self) -> dict[str, Any]:
        data: dict[str, Any] = httpx.get(f"{self.sim}/sim/v1/truth", params={"last": 0}).json()
        return data

    def control(self, what: str, body: dict[str, Any]) -> None:
        httpx.post(f"{self.sim}/sim/v1/{what}", json=body).raise_for_status()

    def cycles_until(self, done: Callable[[], bool], *, at_most: int, what: str) -> list[Any]:
        """Run a cycle every CYCLE_WALL_S (Prometheus must scrape in between) until ``done``."""
        import time

        reports = []
        for _ in range(at_most):
            time.sleep(CYCLE_WALL_S)
            reports.append(self.daemon.safe_cycle())
            if done():
                return reports
        raise AssertionError(f"{what}: not reached in {at_most} cycles; last {reports[-1]}")

    def cycles(self, count: int) -> list[Any]:
        """Exactly ``count`` cycles, CYCLE_WALL_S apart."""
        import time

        reports = []
        for _ in range(count):
            time.sleep(CYCLE_WALL_S)
            reports.append(self.daemon.safe_cycle())
        return reports

    def converged(self) -> bool:
        truth = self.truth()
        return bool(truth["table"] == truth["oracle_table"])

    def am_alerts(self, name: str) -> list[dict[str, Any]]:
        return [a for a in self.am.alerts() if a["labels"].get("alertname") == name]


@pytest.fixture
def make_rig(tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    with ExitStack() as stack:

        def start(scenario: str = "repair", profile: Path = PROFILE, **env: str) -> Rig:
            am = stack.enter_context(alertmanager(tmp_path))
            sim = stack.enter_context(
                emulator(
                    scenario=scenario, profile=profile, speed=SPEED, log_path=tmp_path / "sim.log"
                )
            )
            target = sim.removeprefix("http://")
            prom = stack.enter_context(
                prometheus(tmp_path, [target], scrape_interval="100ms", scrape_timeout="100ms")
            )
            prom.wait_for_targets_up()
            settings = load_settings(
                {
                    "TABLETUNE_SOURCE__PROMETHEUS_URL": prom.url,
                    "TABLETUNE_SOURCE__QUERY_DELAY_S": "0.2",
                    "TABLETUNE_SOURCE__STALE_AFTER_S": "5",
                    "TABLETUNE_PROFILE__PATHS": str(profile),
                    "TABLETUNE_STATE__DIR": str(tmp_path / "state"),
                    "TABLETUNE_LOOP__INTERVAL_S": str(CYCLE_WALL_S),
                    "TABLETUNE_ADMIN__RETRY_BACKOFFS_S": "0.05,0.05",
                    "TABLETUNE_ADMIN__TIMEOUT_S": "2",
                    "TABLETUNE_ALERTS__ALERTMANAGER_URL": am.url,
                    "TABLETUNE_SERVER__PORT": "0",
                    **{f"TABLETUNE_{k}": v for k, v in env.items()},
                }
            )
            daemon = build_daemon(settings)
            stack.callback(daemon.close)
            return Rig(sim=sim, prom=prom, am=am, daemon=daemon, target=target, stack=stack)

        yield start


def test_repair_converges_to_the_oracle_and_alerts_the_shift(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    assert not rig.converged()  # the quarter-docs table is wrong above B=16
    reports = rig.cycles_until(rig.converged, at_most=12, what="oracle table")
    assert any(r.pushed == [rig.target] for r in reports)
    shifted = rig.am.wait_for_alert("TableTuneTableShifted", timeout_s=10)
    assert shifted["labels"]["replica"] == rig.target
    assert shifted["annotations"]["new_table"] == str(rig.truth()["oracle_table"])
    assert rig.truth()["table_worst_loss"]["loss"] <= 0.015
    # Settled: more cycles push no table. (The version may still move: it counts settings
    # too, and directed exploration re-aims the neighbour bursts as the estimate fills in.)
    table = rig.truth()["table"]
    idle = rig.cycles(3)
    assert not any(r.pushed for r in idle)
    assert rig.truth()["table"] == table


def test_chat_like_traffic_gets_k3_where_the_profile_timed_it_eager(
    make_rig: Callable[..., Rig],
) -> None:
    # The H200 case of 2026-11-30 on the emulator: at B=190 with ~600-token prompts every step
    # leaves the full graph, so k=0/1 run far slower than profiled and k=3 (profiled eager)
    # barely: k=3 is best. Borrowing k=1's live/profile ratio for k=3 kept k=1 for ~110 s.
    rig = make_rig("serving-chat-like", profile=H200_INFLIGHT)
    assert rig.truth()["current"]["table_k"] == 0

    def k3_at_the_load() -> bool:
        return bool(rig.truth()["current"]["table_k"] == 3)

    rig.cycles_until(k3_at_the_load, at_most=4, what="k=3 at B=190")
    rig.cycles(3)
    assert k3_at_the_load()  # and it stays


def test_long_context_traffic_takes_k3_though_every_k_runs_8_to_12x_its_profile(
    make_rig: Callable[..., Rig],
) -> None:
    # Prompts of 2,000-4,000 tokens at B=96: every step carries thousands of prefill tokens and
    # reads ~3,100 tokens of context per request, so every k runs 8-12x its profile and a step
    # takes ~100 ms. From the quarter-documented table's k=0 the daemon takes the truth's k=3
    # through Prometheus. (Whether it stays is not pinned: about one run in five a k with a
    # handful of burst steps reads cheaper than it is and clears the one-standard-error bar;
    # docs/results.md, "On the emulator".)
    rig = make_rig("serving-long-context", profile=H200_INFLIGHT)
    current = rig.truth()["current"]
    assert current["table_k"] == 0 and current["best_fixed_k"] == 3

    def k3_at_the_load() -> bool:
        return bool(rig.truth()["current"]["table_k"] == 3)

    rig.cycles_until(k3_at_the_load, at_most=4, what="k=3 at B=96")


def test_acceptance_switch_is_followed(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig("acceptance-switch")
    rig.cycles_until(rig.converged, at_most=12, what="first table")
    before = rig.truth()["oracle_table"]
    rig.control("acceptance", {"rates": [0.45, 0.2, 0.05]})
    assert rig.truth()["oracle_table"] != before

    def close_to_oracle() -> bool:
        worst = rig.truth()["table_worst_loss"]
        return bool(worst is not None and worst["loss"] <= 0.015)

    rig.cycles_until(close_to_oracle, at_most=30, what="table within 1.5 % after the switch")
    assert rig.am_alerts("TableTuneAcceptanceDrift")


def test_restart_resets_counters_and_the_table_is_restored(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    rig.cycles_until(rig.converged, at_most=12, what="oracle table")
    rig.control("restart", {})
    assert not rig.converged()  # the starting table is back
    reports = rig.cycles_until(rig.converged, at_most=12, what="table restored")
    assert any(
        d.reason.startswith("replica restarted") for r in reports for d in r.decisions.values()
    )


def test_admin_5xx_retries_alerts_and_loses_nothing(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    rig.control("faults", {"admin_error_status": 503})
    reports = rig.cycles_until(
        lambda: bool(rig.am_alerts("TableTunePushFailed")), at_most=12, what="push-failed alert"
    )
    assert any(r.failed for r in reports)
    assert not rig.converged()
    assert rig.daemon.metrics.sample("tabletune_daemon_errors_total", {"kind": "admin"}) >= 1  # type: ignore[operator]
    rig.control("faults", {"clear": True})
    rig.cycles_until(rig.converged, at_most=6, what="push after the admin API recovered")
    # Resolved: Alertmanager no longer lists it as active.
    rig.cycles_until(
        lambda: not rig.am_alerts("TableTunePushFailed"), at_most=6, what="push-failed resolved"
    )


def test_prometheus_outage_no_push_alert_then_recovery(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(ESTIMATOR__REBUILD_EVERY_DRAFTS="100000000")  # never push in this test
    rig.cycles(2)
    table = rig.truth()["table"]
    command = [str(arg) for arg in rig.prom.process.args]  # type: ignore[union-attr]
    rig.prom.process.terminate()
    rig.prom.process.wait(timeout=10)
    reports = rig.cycles_until(
        lambda: bool(rig.am_alerts("TableTuneStaleData")), at_most=6, what="stale-data alert"
    )
    assert all(r.outage for r in reports)
    assert not any(r.pushed for r in reports)  # nothing pushed while blind
    assert rig.truth()["table"] == table
    # The same Prometheus comes back (same port and data); the daemon recovers by itself.
    with running(
        command,
        ready_url=f"{rig.prom.url}/-/ready",
        log_path=rig.prom.log_path.with_suffix(".2.log"),
    ):
        rig.prom.wait_for_targets_up()
        reports = rig.cycles_until(
            lambda: not rig.am_alerts("TableTuneStaleData"), at_most=10, what="recovery"
        )
        assert reports[-1].outage is None and reports[-1].observed == [rig.target]
