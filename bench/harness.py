"""The one in-process harness for daemon benchmarks: emulated replicas on a fake wall clock and
the daemon's own ``Controller`` reading them. Only the transport is in process: the daemon parses
each replica's real ``/metrics`` text (``DirectSource`` with a fetch function) and changes tables
through the emulated plugin's admin backend (the same state transitions as over HTTP)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tabletune.admin.client import AdminRefused, AdminRequest, InProcessAdmin
from tabletune.admin.protocol import SettingsPut, TablePut, TableView
from tabletune.admin.state import AdminError
from tabletune.baselines import Policy, StepOutcome
from tabletune.daemon.alerts import AlertSink
from tabletune.daemon.controller import Controller
from tabletune.daemon.direct_source import DirectSource
from tabletune.daemon.metrics import DaemonMetrics
from tabletune.daemon.profiles import load_pools
from tabletune.daemon.settings import DaemonSettings, load_settings
from tabletune.errors import InputError, TemporaryError
from tabletune.sim.build import resolve_profile
from tabletune.sim.engine import EngineSim
from tabletune.sim.replica import Replica, SimClock, Unavailable
from tabletune.sim.scenario import Scenario, load_scenario


class Wall:
    """The one clock of a run: the emulator's wall and the daemon's clock (speed 1)."""

    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def daemon_settings(profile: Path, state_dir: Path, **env: str) -> DaemonSettings:
    return load_settings(
        {
            "TABLETUNE_PROFILE__PATHS": str(profile),
            "TABLETUNE_STATE__DIR": str(state_dir),
            "TABLETUNE_SERVER__PORT": "0",
            **{f"TABLETUNE_{k}": v for k, v in env.items()},
        }
    )


class ReplicaAdmin(InProcessAdmin):
    """The daemon's admin client, calling the emulated plugin's HTTP side in process.

    The daemon calls replicas from several threads at once; the emulated replicas share one
    event loop, so calls into it take turns (``lock``)."""

    def __init__(
        self, replica: Replica, loop: asyncio.AbstractEventLoop, lock: threading.Lock
    ) -> None:
        self.replica = replica
        self.loop = loop
        self.lock = lock

    def answer(self, request: AdminRequest, if_match: int | None) -> TableView:
        admin = self.replica.admin

        async def call() -> TableView:
            if isinstance(request, TablePut):
                return (await admin.put_table(request, if_match)).view
            if isinstance(request, SettingsPut):
                return await admin.put_settings(request, if_match)
            return await admin.get_view()

        try:
            with self.lock:
                view = self.loop.run_until_complete(call())
        except AdminError as error:
            if error.status >= 500:
                raise TemporaryError(f"HTTP {error.status}: {error.detail}") from None
            raise AdminRefused(error.status, error.detail) from None
        return view


class Rig:
    """Emulated replicas on a fake wall clock, and the daemon reading them in process."""

    def __init__(
        self,
        scenario_name: str,
        profile: Path,
        workdir: Path,
        *,
        replicas: int = 1,
        overrides: Mapping[str, Any] | None = None,
        **env: str,
    ) -> None:
        """``overrides``: scenario fields replaced (``seed``, ``step_noise``, ``load``...)."""
        scenario, base_dir = load_scenario(scenario_name)
        if overrides:
            scenario = Scenario.model_validate({**scenario.model_dump(), **overrides})
        self.scenario = scenario
        self.wall = Wall()
        clock = SimClock(speed=1.0, start_wall=self.wall(), wall=self.wall)
        prof = resolve_profile(scenario, base_dir, profile)
        self.replicas = {
            f"sim://{i}": Replica(scenario, prof, base_dir=base_dir, clock=clock, index=i)
            for i in range(replicas)
        }
        self.loop = asyncio.new_event_loop()
        self.lock = threading.Lock()
        self.settings = daemon_settings(profile, workdir / "state", **env)
        source = DirectSource(
            settings=self.settings.source, replicas=list(self.replicas), fetch=self.fetch
        )
        admins = {url: ReplicaAdmin(r, self.loop, self.lock) for url, r in self.replicas.items()}
        self.controller = Controller(
            settings=self.settings,
            source=source,
            pools=load_pools(self.settings.profile),
            admin_for=admins.__getitem__,
            alerts=AlertSink(settings=self.settings.alerts, condition_ttl_s=120),
            metrics=DaemonMetrics(),
            clock=self.wall,
            sleep=self.wall.sleep,
        )

    def fetch(self, url: str) -> str:
        try:
            with self.lock:
                text = self.loop.run_until_complete(self.replicas[url].metrics_text())
        except Unavailable as error:
            raise InputError(f"{url}: {error}") from None
        return text.decode()

    def metrics_rollbacks(self) -> float:
        total = 0.0
        for url in self.replicas:
            value = self.controller.metrics.sample(
                "tabletune_daemon_rollbacks_total", {"replica": url}
            )
            total += value or 0.0
        return total

    @property
    def sim_s(self) -> float:
        return next(iter(self.replicas.values())).clock.sim_now()

    def truth(self) -> dict[str, Any]:
        return next(iter(self.replicas.values())).truth(last=0)


def run_per_step(policy: Policy, engine: EngineSim, until_s: float) -> None:
    """Drive a per-step policy: it chooses k (the engine's hook), then sees that step's counts."""
    while engine.now < until_s:
        done = engine.step()
        if done is None:
            return
        policy.observe(
            StepOutcome(
                batch_size=done.batch_size,
                k=int(done.ks[0]),
                step_ms=float(done.durations_s[0]) * 1000.0,
                drafted=tuple(int(x) for x in done.drafted_per_pos),
                accepted=tuple(int(x) for x in done.accepted_per_pos),
            )
        )
