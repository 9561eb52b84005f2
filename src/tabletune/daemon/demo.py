"""``tabletune demo``: the whole loop on one machine, no GPU, no Prometheus.

Starts the engine emulator (``tabletune sim serve``) with a profile and the *repair* scenario
(a quarter-scale copy of vLLM's documented table that throws goodput away), runs the daemon
against it in direct-scrape mode, and shows live the table, a_hat and goodput against the
oracle, read from the emulator's ground-truth endpoint (never from the daemon). Ends with a
summary line and a PNG.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import structlog
from rich.console import Console
from rich.live import Live
from rich.table import Table as RichTable

from tabletune.admin.auth import OPEN_ENV, OPEN_LOOPBACK, TOKEN_ENV, TOKEN_FILE_ENV
from tabletune.daemon import logs
from tabletune.daemon.service import Daemon, build_daemon
from tabletune.daemon.settings import load_settings
from tabletune.errors import InputError, TemporaryError
from tabletune.schemas import load_profile
from tabletune.schemas.profile import step_times_of
from tabletune.solver import SolverError, StepTimes, evaluate_table

SAMPLE_PROFILE = Path("examples/sample-profile.json")
CONVERGED_LOSS = 0.015  # "within 1.5 % of the oracle at every load"


def choose_profile(root: Path = Path(".")) -> Path:
    """A measured profile from profiles/ when there is one, else the labelled sample."""
    for path in sorted((root / "profiles").glob("*.json")):
        try:
            profile = load_profile(path)
        except InputError:
            continue
        if not profile.metadata.sample and not profile.metadata.incomplete:
            return path
    sample = root / SAMPLE_PROFILE
    if not sample.exists():
        raise InputError(f"no profile: neither profiles/*.json nor {sample} exists")
    return sample


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def emulator(
    *,
    scenario: str,
    profile: Path | None,
    speed: float,
    port: int | None = None,
    log_path: Path | None = None,
    timeout_s: float = 30.0,
    admin_token: str | None = None,
) -> Iterator[str]:
    """A ``tabletune sim serve`` subprocess on a free port; yields its base URL. Its admin API
    takes ``admin_token``, or without one writes from this machine (TABLETUNE_ADMIN_OPEN)."""
    port = port or _free_port()
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV, OPEN_ENV)}
    env.update({TOKEN_ENV: admin_token} if admin_token else {OPEN_ENV: OPEN_LOOPBACK})
    command = [
        sys.executable,
        "-m",
        "tabletune.cli.main",
        "sim",
        "serve",
        "--scenario",
        scenario,
        "--port",
        str(port),
        "--speed",
        f"{speed:g}",
    ]
    if profile is not None:
        command += ["--profile", str(profile)]
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise TemporaryError(f"the emulator exited with {process.returncode}")
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TemporaryError(f"the emulator did not answer on {url} in {timeout_s} s")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if log_path:
            log.close()  # type: ignore[union-attr]


@dataclass
class Timeline:
    """What the ground truth said at each cycle, for the live view, the summary and the PNG."""

    sim_s: list[float] = field(default_factory=list)
    load: list[int] = field(default_factory=list)
    worst_loss: list[float | None] = field(default_factory=list)
    efficiency: list[float | None] = field(default_factory=list)
    estimate: list[tuple[float, ...]] = field(default_factory=list)
    truth: list[tuple[float, ...]] = field(default_factory=list)
    pushes: list[float] = field(default_factory=list)
    first_converged_s: float | None = None
    starting_worst: dict[str, Any] | None = None  # the starting table's worst load and loss
    goodput_before: list[tuple[float, float]] = field(default_factory=list)  # (tokens, oracle)
    goodput_after: list[tuple[float, float]] = field(default_factory=list)
    starting_table: list[list[int]] | None = None
    # model goodput / oracle at the running load, each cycle: the starting table kept vs ours
    kept_share: list[float] = field(default_factory=list)
    ours_share: list[float] = field(default_factory=list)


def goodput_at(
    step_times: StepTimes, rates: list[float], table: list[list[int]], batch: int
) -> float:
    """Model goodput (tokens/ms) of ``table`` at batch size ``batch``."""
    return evaluate_table(
        step_times, rates, [(r[0], r[1], r[2]) for r in table], max_batch=batch, max_k=len(rates)
    ).goodput[batch - 1]


def _efficiency(truth: dict[str, Any]) -> float | None:
    intervals = truth.get("intervals") or []
    if not intervals:
        return None
    last = intervals[-1]
    value = last.get("efficiency")
    return float(value) if value is not None else None


def loss_vs_oracle(truth: dict[str, Any], step_times: StepTimes) -> dict[str, Any] | None:
    """Worst load of the running table against the oracle table (true a_i, captured k only)."""
    if truth.get("table") is None or not truth.get("rates"):
        return None
    top = min(step_times.max_batch, max(r[1] for r in truth["oracle_table"]))
    try:
        ran, best = (
            evaluate_table(
                step_times,
                truth["rates"],
                [tuple(r) for r in table],
                max_batch=top,
                max_k=len(truth["rates"]),
            ).goodput
            for table in (truth["table"], truth["oracle_table"])
        )
    except SolverError:
        return None
    losses = [1.0 - r / o for r, o in zip(ran, best, strict=True)]
    worst = max(range(len(losses)), key=losses.__getitem__)
    return {"loss": losses[worst], "batch_size": worst + 1}


def render(truth: dict[str, Any], daemon: Daemon, timeline: Timeline) -> RichTable:
    view = RichTable(title="TableTune demo: daemon vs ground truth (emulator)", expand=False)
    view.add_column("what", style="bold")
    view.add_column("value")
    unit = next(iter(daemon.controller.units.values()), None)
    estimate = ", ".join(f"{a:.3f}" for a in unit.rates) if unit else "(prior)"
    loss = truth.get("loss_vs_oracle") or {}
    current = truth.get("current") or {}
    view.add_row("simulated time", f"{truth['sim_time_s']:.0f} s (x{truth['speed']:g})")
    view.add_row("running requests B", str(current.get("batch_size", 0)))
    view.add_row("table (engine)", str(truth.get("table")))
    view.add_row("oracle table", str(truth.get("oracle_table")))
    view.add_row("a_hat (daemon)", estimate)
    view.add_row("a (true)", ", ".join(f"{a:.3f}" for a in truth.get("rates", [])))
    if "table_goodput_tokens_per_s" in current:
        view.add_row(
            "goodput now",
            f"{current['table_goodput_tokens_per_s']:,.0f} tok/s vs oracle "
            f"{current['best_goodput_tokens_per_s']:,.0f} (loss {current['loss']:.1%})",
        )
    if loss:
        view.add_row("worst loss vs oracle, all B", f"{loss['loss']:.1%} at B={loss['batch_size']}")
    eff = _efficiency(truth)
    if eff is not None:
        view.add_row("last interval: goodput / oracle", f"{eff:.1%}")
    view.add_row("pushes", ", ".join(f"{t:.0f} s" for t in timeline.pushes) or "none yet")
    return view


def run_demo(
    *,
    scenario: str,
    profile: Path,
    speed: float,
    duration_s: float,
    interval_s: float,
    png: Path | None,
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
                _loop(
                    daemon,
                    truth_client,
                    timeline,
                    console,
                    duration_s,
                    interval_s / speed,
                    step_times_of(load_profile(profile)),
                )
            finally:
                truth_client.close()
                daemon.close()
    if png is not None:
        plot(timeline, png)
    return timeline


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
            truth = truth_client.get("/sim/v1/truth", params={"last": 1}).json()
            truth["loss_vs_oracle"] = loss_vs_oracle(truth, step_times)
            _counterfactual(truth, step_times, timeline)
            sim_s = float(truth["sim_time_s"])
            if report is not None and report.pushed:
                timeline.pushes.append(sim_s)
            _record(truth, daemon, timeline, sim_s)
            view = render(truth, daemon, timeline)
            if live_ok:
                live.update(view, refresh=True)
            else:
                loss = timeline.worst_loss[-1]
                shown = "n/a" if loss is None else f"{loss:.1%}"
                console.print(f"t={sim_s:6.0f}s table={truth.get('table')} worst loss={shown}")
            if sim_s >= duration_s:
                if not live_ok:
                    console.print(view)
                break
            next_at += wall_interval_s
            time.sleep(max(0.0, next_at - time.monotonic()))


def _counterfactual(truth: dict[str, Any], step_times: StepTimes, timeline: Timeline) -> None:
    """What the starting table would give at this load, next to what runs now (the model)."""
    if timeline.starting_table is None:
        timeline.starting_table = truth.get("table")
    batch = int((truth.get("current") or {}).get("batch_size", 0))
    rates = truth.get("rates")
    if not batch or not rates or truth.get("table") is None or timeline.starting_table is None:
        return
    batch = min(batch, step_times.max_batch)
    try:
        oracle = goodput_at(step_times, rates, truth["oracle_table"], batch)
        timeline.kept_share.append(
            goodput_at(step_times, rates, timeline.starting_table, batch) / oracle
        )
        timeline.ours_share.append(goodput_at(step_times, rates, truth["table"], batch) / oracle)
    except SolverError:
        return


def _record(truth: dict[str, Any], daemon: Daemon, timeline: Timeline, sim_s: float) -> None:
    loss_info = truth.get("loss_vs_oracle") or {}
    loss = loss_info.get("loss")
    if timeline.starting_worst is None and loss_info:
        timeline.starting_worst = dict(loss_info)
    timeline.sim_s.append(sim_s)
    timeline.load.append(int((truth.get("current") or {}).get("batch_size", 0)))
    timeline.worst_loss.append(loss)
    timeline.efficiency.append(_efficiency(truth))
    unit = next(iter(daemon.controller.units.values()), None)
    timeline.estimate.append(tuple(unit.rates) if unit else ())
    timeline.truth.append(tuple(truth.get("rates", ())))
    converged = loss is not None and loss <= CONVERGED_LOSS
    if converged and timeline.first_converged_s is None:
        timeline.first_converged_s = sim_s
    if not converged:
        timeline.first_converged_s = None  # must stay within 1.5 % once reached
    intervals = truth.get("intervals") or []
    if intervals:
        last = intervals[-1]
        pair = (float(last["tokens"]), float(last["oracle_tokens"]))
        (timeline.goodput_after if timeline.pushes else timeline.goodput_before).append(pair)


def share(pairs: list[tuple[float, float]]) -> float | None:
    tokens = sum(t for t, _ in pairs)
    oracle = sum(o for _, o in pairs)
    return tokens / oracle if oracle > 0 else None


def summary(timeline: Timeline) -> str:
    after = share(timeline.goodput_after)
    parts = [f"demo: {len(timeline.pushes)} push(es)"]
    if timeline.starting_worst:
        worst = timeline.starting_worst
        parts.append(
            f"starting table lost {worst['loss']:.1%} of the goodput at B={worst['batch_size']}"
        )
    parts += [
        "table within 1.5 % of the oracle at every load from "
        + (
            f"t={timeline.first_converged_s:.0f} s"
            if timeline.first_converged_s is not None
            else "never"
        ),
    ]
    if timeline.ours_share:
        kept = sum(timeline.kept_share) / len(timeline.kept_share)
        ours = sum(timeline.ours_share) / len(timeline.ours_share)
        parts.append(
            f"at the loads seen, the starting table would give {kept:.1%} of the oracle's "
            f"goodput, the daemon's tables {ours:.1%} (model)"
        )
    if after is not None:
        parts.append(
            f"measured by the emulator after the first push: {after:.1%} of the oracle "
            "(the plugin's exploration steps included)"
        )
    return "; ".join(parts)


def plot(timeline: Timeline, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    t = timeline.sim_s
    eff = [float("nan") if e is None else 100 * e for e in timeline.efficiency]
    worst = [float("nan") if w is None else 100 * w for w in timeline.worst_loss]
    top.plot(t, eff, label="goodput / oracle, last 10 s (%)")
    top.plot(t, worst, label="worst loss vs oracle over all B (%)")
    for push in timeline.pushes:
        top.axvline(push, color="grey", linestyle=":", linewidth=1)
    top.set_ylabel("%")
    top.legend(loc="best")
    top.set_title("TableTune daemon on the emulator (dotted: table pushes)")
    positions = max((len(e) for e in timeline.estimate), default=0)
    for i in range(positions):
        top_line = [e[i] if len(e) > i else float("nan") for e in timeline.estimate]
        (line,) = bottom.plot(t, top_line, label=f"a_hat_{i + 1}")
        truth = [r[i] if len(r) > i else float("nan") for r in timeline.truth]
        bottom.plot(t, truth, linestyle="--", color=line.get_color(), label=f"a_{i + 1} (true)")
    bottom.set_xlabel("simulated time (s)")
    bottom.set_ylabel("acceptance")
    bottom.legend(loc="best", ncol=2, fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the daemon repairing a bad table on the emulator (no GPU, no Prometheus)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--scenario", default="repair", help="emulator scenario (default repair)")
    parser.add_argument("--profile", type=Path, help="profile JSON (default: profiles/ or sample)")
    parser.add_argument(
        "--speed", type=float, default=20.0, help="simulated seconds per wall second (default 20)"
    )
    parser.add_argument(
        "--duration", type=float, default=900.0, help="simulated seconds to run (default 900)"
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=15.0,
        help="simulated seconds between daemon cycles (default 15)",
    )
    parser.add_argument(
        "--png",
        type=Path,
        default=Path("out/tabletune-demo.png"),
        help="where to write the plot (default tabletune-demo.png)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not (args.speed > 0 and args.duration > 0 and args.interval > 0):
        raise InputError("--speed, --duration and --interval must be > 0")
    profile = args.profile or choose_profile()
    console = Console()
    console.print(
        f"tabletune demo: scenario {args.scenario!r}, profile {profile}, "
        f"x{args.speed:g} speed, {args.duration:.0f} s simulated"
    )
    with tempfile.TemporaryDirectory(prefix="tabletune-demo-") as tmp:
        timeline = run_demo(
            scenario=args.scenario,
            profile=profile,
            speed=args.speed,
            duration_s=args.duration,
            interval_s=args.interval,
            png=args.png,
            console=console,
            workdir=Path(tmp),
        )
    structlog.reset_defaults()
    console.print(summary(timeline))
    console.print(f"plot: {args.png}")
    return 0
