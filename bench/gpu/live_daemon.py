"""The daemon with live step time on real vLLM 0.26 (+ the plugin), in ONE launch
(``DRIVER=bench/gpu/live_daemon.py bash bench/gpu/live_step_time.sh``).

Same server and traffic as live_step_time.py (128 closed-loop clients, lengths from a named shape
of traffic.py: by default decode-heavy, prompts 16-96 tokens, outputs 300-700; contexts spread).
Parts, in this order:

  fixed-k     references: fixed k=2 / k=3, ABBA, ROUNDS windows per arm
  bursts      table k=3, neighbour bursts (BURST_INTERVAL steps apart, BURST steps each): the
              k=2 steps after a burst's first (in the cells) vs the fixed k=2 arm, and the
              switch steps counted apart
  daemon      the measured profile's table put in, then ``tabletune daemon`` (direct scrape,
              DAEMON_CYCLE_S cycles, live step time, its default neighbour bursts) for
              DAEMON_S seconds: windows of tokens/s and the table's k at the running load; then
              the daemon stops and fixed k=2, k=3 and the daemon's last table are measured
              again, rotated
  overhead    step_timing false vs true with fixed-length requests (prompt 64, output 512),
              ABBA: less traffic noise than random lengths

Every window is a raw row as in live_step_time.py; the JSON is rewritten after every part.
bench/gpu/live_daemon_report.py turns it into bench/results/live_daemon_h200.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from live_daemon_report import notable_log_lines, trial_at_stop
from live_step_time import (  # this script's folder is first on sys.path
    SETTINGS_PATH,
    STATIC,
    TABLE_PATH,
    TIMING_OFF,
    Row,
    abba,
    add_job_arguments,
    empty_result,
    wait_started,
)
from live_step_time import Run as StepTimeRun
from traffic import SHAPES, TrafficShape, Uniform, add_traffic_arguments, checked_shape

FIXED_LENGTHS = TrafficShape("fixed", prompt=Uniform(64, 64), output=Uniform(512, 512))
TIMING_ON = {"step_timing": True, "exploration_interval": 0, "hysteresis": 0,
             "neighbour_interval": 0}  # fmt: skip


class Run(StepTimeRun):
    """The step-time job's parts and windows; this job writes its rows without a summary (its
    report, live_daemon_report.py, reads them after the run)."""

    def save(self) -> None:
        Path(self.args.out).write_text(json.dumps(self.result, indent=1) + "\n")

    async def put_table(self, table: list[list[int]]) -> None:
        await self.server.put(TABLE_PATH, {"table": table})

    async def fixed(self, part: str, arms: list[str], seconds: float) -> None:
        await self.server.put(SETTINGS_PATH, STATIC)
        for index, arm in enumerate(arms):
            await self.put_table(self.tables[arm])
            await asyncio.sleep(self.args.settle_s)
            await self.window(part, arm, index, seconds)

    @property
    def tables(self) -> dict[str, list[list[int]]]:
        found = {"k2": self.fixed_table(2), "k3": self.fixed_table(3)}
        if self.result.get("daemon_table"):
            found["daemon"] = self.result["daemon_table"]
        return found

    async def bursts(self) -> None:
        await self.put_table(self.fixed_table(3))
        settings = {**STATIC, "neighbour_interval": self.args.burst_interval,
                    "neighbour_burst": self.args.burst}  # fmt: skip
        await self.server.put(SETTINGS_PATH, settings)
        await asyncio.sleep(self.args.settle_s)
        await self.window("bursts", f"i{self.args.burst_interval}b{self.args.burst}", 0,
                          self.args.burst_window_s)  # fmt: skip
        await self.server.put(SETTINGS_PATH, STATIC)

    async def daemon(self) -> None:
        start = json.loads(self.args.start_table)
        self.result["daemon_table"] = await self.run_daemon("daemon", start, self.args.daemon_s)
        self.save()
        await self.fixed("after-daemon", ["k2", "daemon", "k3"], self.args.window_s)

    async def run_daemon(
        self,
        part: str,
        start_table: list[list[int]],
        seconds: float,
        *,
        event: tuple[float, Callable[[], Awaitable[None]]] | None = None,
    ) -> list[list[int]]:
        """``start_table`` put in, then ``tabletune daemon`` (direct scrape, live step time) for
        ``seconds``, windows of tokens/s meanwhile; the daemon stopped (SIGTERM), its last table
        returned. ``event`` (at_s, action): the action runs between windows once ``at_s``
        seconds have passed (a change of traffic under the running daemon). The state
        directory is kept across calls (what it learnt stays)."""
        await self.server.put(SETTINGS_PATH, STATIC)
        await self.put_table(start_table)
        state = Path(self.args.work) / "daemon-state"
        state.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "TABLETUNE_SOURCE__REPLICAS": self.args.base,
            "TABLETUNE_PROFILE__PATHS": self.args.profile,
            "TABLETUNE_LOOP__INTERVAL_S": str(self.args.daemon_cycle_s),
            "TABLETUNE_STATE__DIR": str(state),
            "TABLETUNE_SERVER__PORT": "0",
            "TABLETUNE_LOG__FORMAT": "json",
        }
        log_path = Path(self.args.work) / f"daemon-{part}.log"
        log = open(log_path, "w")  # noqa: SIM115 (closed below)
        daemon = subprocess.Popen(
            [sys.executable, "-m", "tabletune.cli.main", "daemon"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        started = time.monotonic()
        try:
            index = 0
            while time.monotonic() - started < seconds:
                if event is not None and time.monotonic() - started >= event[0]:
                    await event[1]()
                    event = None
                row = await self.window(part, "live", index, self.args.window_s)
                row["since_daemon_start_s"] = round(time.monotonic() - started, 1)
                index += 1
        finally:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()
            log.close()
        view = await self.server.view()
        lines = log_path.read_text().splitlines()
        self.result.setdefault("daemon_log_tails", {})[part] = lines[-60:]
        # A 200-s part's pushes and rollbacks are long out of the tail: what it did, whole.
        self.result.setdefault("daemon_log_events", {})[part] = notable_log_lines(lines)
        # Stopped inside a trial, the engine keeps the trial's table: the daemon's own is the
        # one the trial replaced (a trial lasts seconds; its cost shows in the part's windows).
        trial = trial_at_stop(lines)
        if trial is None:
            return list(view["table"])
        self.result.setdefault("daemon_trials_at_stop", {})[part] = {
            **trial, "table_in_the_engine": view["table"]}  # fmt: skip
        return [list(r) for r in trial["standing"]]

    async def overhead(self) -> None:
        await self.put_table(self.fixed_table(3))
        await asyncio.sleep(self.args.warmup_s / 2)
        per_window = self.args.overhead_window_s + self.args.settle_s + 1.5
        rounds = max(
            3, min(self.args.overhead_rounds, int((self.left_s() - 10) // (2 * per_window)))
        )
        for index, arm in enumerate(abba(("on", "off"), rounds)):
            await self.server.put(SETTINGS_PATH, TIMING_ON if arm == "on" else TIMING_OFF)
            await asyncio.sleep(self.args.settle_s)
            await self.window("overhead", arm, index, self.args.overhead_window_s)
        await self.server.put(SETTINGS_PATH, {**STATIC, "step_timing": True})


# A daemon setting in the environment: TABLETUNE_<GROUP>__<NAME> (the plugin's own variables,
# TABLETUNE_SYNC_INTERVAL_S and the like, have no group).
DAEMON_SETTING = re.compile(r"TABLETUNE_[A-Z]+__[A-Z_]+")


def daemon_meta(args: argparse.Namespace) -> Row:
    """How the daemon part ran: its cycle, length, prior and starting table, and the daemon
    settings the job's environment changed (``TABLETUNE_DECISION__TRIALS=true``...)."""
    return {
        "cycle_s": args.daemon_cycle_s,
        "run_s": args.daemon_s,
        "profile": args.profile,
        "start_table": json.loads(args.start_table),
        "settings_from_env": daemon_settings_from_env(os.environ),
    }


def daemon_settings_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The daemon's settings (TABLETUNE_<GROUP>__<NAME>) set in the job's environment."""
    return {key: value for key, value in sorted(environ.items()) if DAEMON_SETTING.match(key)}


async def run(args: argparse.Namespace) -> int:
    result = empty_result(
        {
            "what": "the daemon with live step time on real vLLM: fixed-k references, neighbour "
            "bursts, the daemon from the profile's table, step-timing overhead",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            **json.loads(args.meta),
            "clients": args.clients,
            "lengths": SHAPES[args.shape].describe(),
            "overhead_lengths": FIXED_LENGTHS.describe(),
            "window_s": args.window_s,
            "burst": {"interval": args.burst_interval, "steps": args.burst},
            "daemon": daemon_meta(args),
        }
    )
    live = Run(args, result)
    if not await wait_started(live):
        return 1
    per_window = args.window_s + args.settle_s + 1.5
    parts = set(args.parts.split(","))
    load = live.closed_loop(seed=1)
    await live.part("warmup", args.warmup_s, lambda: asyncio.sleep(args.warmup_s))
    arms = abba(("k2", "k3"), args.rounds)
    if "fixed-k" in parts:
        await live.part("fixed-k", len(arms) * per_window,
                        lambda: live.fixed("fixed-k", arms, args.window_s))  # fmt: skip
    if "bursts" in parts:
        await live.part("bursts", args.burst_window_s + 8, live.bursts)
    if "daemon" in parts:
        await live.part("daemon", args.daemon_s + 4 * per_window, live.daemon)
    await load.drain()
    if "overhead" in parts:
        load = live.closed_loop(seed=2, shape=FIXED_LENGTHS)
        await live.part("overhead", 6 * (args.overhead_window_s + 4) + 10, live.overhead)
        await load.drain()
    return live.finish()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_job_arguments(parser)
    parser.add_argument("--clients", type=int, default=128)
    parser.add_argument("--warmup-s", type=float, default=20)
    parser.add_argument("--window-s", type=float, default=10)
    parser.add_argument("--settle-s", type=float, default=2.5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--burst-interval", type=int, default=32)
    parser.add_argument("--burst", type=int, default=8)
    parser.add_argument("--burst-window-s", type=float, default=20)
    parser.add_argument("--profile", default="profiles/h200-qwen3-4b-eagle3.json")
    parser.add_argument("--start-table", required=True, help="JSON ranges the daemon starts from")
    parser.add_argument("--daemon-cycle-s", type=float, default=5)
    parser.add_argument("--daemon-s", type=float, default=110)
    parser.add_argument("--work", default=None,
                        help="the daemon's state and logs (default: a fresh temporary folder, "
                        "so no earlier run's state is restored)")  # fmt: skip
    parser.add_argument("--overhead-window-s", type=float, default=8)
    parser.add_argument("--overhead-rounds", type=int, default=5)
    parser.add_argument("--parts", default="fixed-k,bursts,daemon,overhead")
    add_traffic_arguments(parser)
    args = parser.parse_args()
    args.work = args.work or tempfile.mkdtemp(prefix="tt-daemon-")
    checked_shape(parser, args)
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
