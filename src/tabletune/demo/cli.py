"""``tabletune demo``: the whole loop on one machine, no GPU, no Prometheus.

Starts the engine emulator (``tabletune sim serve``) with a profile and the demo's scenario (a
quarter-scale copy of vLLM's documented table, with the load starting at B=96, where that table
runs k=0 and throws goodput away), runs the daemon against it in direct-scrape mode, and shows
live the table, a_hat and goodput against the oracle, read from the emulator's ground-truth
endpoint (never from the daemon). Ends with a summary line and a PNG.
"""

from __future__ import annotations

import argparse
import math
import signal
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import structlog
from rich.console import Console
from rich.live import Live

from tabletune.cli.inputs import make_output_folder, number_type
from tabletune.daemon import logs
from tabletune.daemon.service import Daemon, build_daemon
from tabletune.daemon.settings import load_settings
from tabletune.demo import view
from tabletune.demo.emulator import emulator
from tabletune.demo.plot import plot
from tabletune.demo.truth import Timeline, record, summary
from tabletune.errors import InputError
from tabletune.schemas import load_profile
from tabletune.sim.build import resolve_profile, usable_step_times
from tabletune.sim.scenario import load_scenario
from tabletune.solver import StepTimes

DEMO_SCENARIO = Path(str(resources.files("tabletune.demo") / "scenario.yaml"))
SAMPLE_PROFILE = Path(str(resources.files("tabletune.sim.scenarios") / "sample-profile.json"))
"""the labelled sample profile, packaged with the emulator (examples/ holds the same file)"""
DEFAULT_MEASURED = "h200-qwen3-4b-eagle3.json"  # Qwen3-4B + EAGLE-3 on the H200 (README)
_positive = number_type(float, lambda v: 0 < v < math.inf, "a finite number > 0")


def choose_profile(root: Path = Path(".")) -> Path:
    """A measured profile from ``root/profiles/`` when there is one (``DEFAULT_MEASURED`` first,
    the one the README names; other targets' profiles sort before it), else the packaged
    sample (so the demo runs from any folder, not only from a checkout)."""
    found = sorted((root / "profiles").glob("*.json"))
    for path in sorted(found, key=lambda p: p.name != DEFAULT_MEASURED):
        try:
            profile = load_profile(path)
        except InputError:
            continue
        if not profile.metadata.sample and not profile.metadata.incomplete:
            return path
    return SAMPLE_PROFILE


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the daemon repairing a bad table on the emulator (no GPU, no Prometheus)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--scenario",
        default=str(DEMO_SCENARIO),
        help="emulator scenario: a file or a packaged name (default: the demo's own)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="profile JSON (default: a measured one in ./profiles, else the packaged sample)",
    )
    parser.add_argument(
        "--speed",
        type=_positive,
        default=20.0,
        help="simulated seconds per wall second (default 20)",
    )
    parser.add_argument(
        "--duration", type=_positive, default=900.0, help="simulated seconds to run (default 900)"
    )
    parser.add_argument(
        "--interval",
        type=_positive,
        default=15.0,
        help="simulated seconds between daemon cycles (default 15)",
    )
    parser.add_argument(
        "--png",
        type=Path,
        default=Path("out/tabletune-demo.png"),
        help="where to write the plot; its folder is created (default out/tabletune-demo.png)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # Every input is checked before the emulator starts: a bad one is a line, not a minute.
    if args.interval > args.duration:
        raise InputError(
            f"--interval {args.interval:g} is longer than --duration {args.duration:g}"
        )
    profile = args.profile or choose_profile()
    scenario, base_dir = load_scenario(args.scenario)
    step_times = usable_step_times(scenario, resolve_profile(scenario, base_dir, profile))
    make_output_folder(args.png, "--png")
    signal.signal(signal.SIGTERM, _interrupt)  # stop the emulator on the way out, as on Ctrl-C
    # Plain text: whole lines when piped, no markup or highlighting read into tables and paths.
    console = Console(soft_wrap=True, highlight=False, markup=False)
    console.print(
        f"tabletune demo: scenario {scenario.name!r}, profile {profile}, "
        f"x{args.speed:g} speed, {args.duration:.0f} s simulated"
    )
    with tempfile.TemporaryDirectory(prefix="tabletune-demo-") as tmp:
        timeline = run_demo(
            scenario=args.scenario,
            profile=profile,
            step_times=step_times,
            speed=args.speed,
            duration_s=args.duration,
            interval_s=args.interval,
            console=console,
            workdir=Path(tmp),
        )
    structlog.reset_defaults()
    plot(timeline, args.png)
    console.print(summary(timeline))
    console.print(f"plot: {args.png}")
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(
    *,
    scenario: str,
    profile: Path,
    step_times: StepTimes,
    speed: float,
    duration_s: float,
    interval_s: float,
    console: Console,
    workdir: Path,
) -> Timeline:
    timeline = Timeline()
    with emulator(
        scenario=scenario, profile=profile, speed=speed, log_path=workdir / "emulator.log"
    ) as url:
        settings = load_settings(
            {
                "TABLETUNE_SOURCE__REPLICAS": url,
                "TABLETUNE_PROFILE__PATHS": str(profile),
                "TABLETUNE_STATE__DIR": str(workdir / "state"),
                "TABLETUNE_LOOP__INTERVAL_S": str(interval_s / speed),
                "TABLETUNE_GUARD__WINDOW_S": str(20 * interval_s / speed),
                "TABLETUNE_SERVER__PORT": "0",
            }
        )
        with open(workdir / "daemon.log", "w", encoding="utf-8") as log_file:
            logs.configure(level="info", fmt="json", stream=log_file)
            daemon = build_daemon(settings)
            truth_client = httpx.Client(base_url=url, timeout=10.0)
            try:
                wall_s = interval_s / speed
                _loop(daemon, truth_client, timeline, console, duration_s, wall_s, step_times)
            finally:
                truth_client.close()
                daemon.close()
    return timeline


def _estimate(daemon: Daemon) -> tuple[float, ...]:
    unit = next(iter(daemon.controller.units.values()), None)
    return tuple(unit.rates) if unit else ()


def _loop(
    daemon: Daemon,
    truth_client: httpx.Client,
    timeline: Timeline,
    console: Console,
    duration_s: float,
    wall_interval_s: float,
    step_times: StepTimes,
) -> None:
    live_ok = console.is_terminal
    with Live(console=console, auto_refresh=False, transient=False) as live:
        next_at = time.monotonic()
        while True:
            report = daemon.safe_cycle()
            # The last two intervals: a cycle (15 s) may span more than one (10 s).
            truth = truth_client.get("/sim/v1/truth", params={"last": 2}).json()
            estimate = _estimate(daemon)
            pushed = report is not None and bool(report.pushed)
            record(truth, estimate, timeline, step_times, pushed=pushed)
            if live_ok:
                live.update(view.render(truth, estimate, timeline), refresh=True)
            else:
                console.print(view.line(truth, estimate, timeline))
            if timeline.sim_s[-1] >= duration_s:
                break
            next_at += wall_interval_s
            time.sleep(max(0.0, next_at - time.monotonic()))
