"""Daemon benchmarks on the emulator's pure core (simulated time, no HTTP where HTTP is not the
point), written to bench/results/daemon_bench.json.

1. repair: the ``repair`` scenario (a quarter-scale copy of vLLM's documented table); simulated
   seconds from the daemon's start until the engine's table is within 1.5 % of the oracle at
   EVERY load (and stays there). Goal <= 60 s.
2. switch: the ``acceptance-switch`` scenario (acceptance drops at t=300 s); share of the gap
   (goodput of the table running at the switch vs the oracle for the new acceptance) recovered
   30 s after the switch. Goal >= 98 %.
3. scale: 1,000 emulated replicas; the daemon's cycle time (goal <= 2 s) and the daemon
   process's peak RSS (goal <= 200 MB). The emulator records each replica's /metrics text per
   cycle; a separate process that holds only the daemon replays them (real parsing, estimation,
   decisions and pushes into the real admin state transitions), so its RSS is the daemon's.

    .venv/bin/python bench/daemon_bench.py            # all three
    .venv/bin/python bench/daemon_bench.py --quick    # fewer phases and 200 replicas
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from bench.common import environment, write_result  # noqa: E402
from bench.harness import Rig, Wall, daemon_settings  # noqa: E402
from tabletune.admin.client import StateAdminClient  # noqa: E402
from tabletune.admin.protocol import EngineIdentity  # noqa: E402
from tabletune.admin.state import TableState  # noqa: E402
from tabletune.daemon import logs  # noqa: E402
from tabletune.daemon.alerts import AlertSink  # noqa: E402
from tabletune.daemon.controller import Controller  # noqa: E402
from tabletune.daemon.direct_source import DirectSource  # noqa: E402
from tabletune.daemon.metrics import DaemonMetrics  # noqa: E402
from tabletune.daemon.profiles import load_pools  # noqa: E402
from tabletune.demo.cli import choose_profile  # noqa: E402
from tabletune.sim.build import resolve_profile  # noqa: E402
from tabletune.sim.replica import Replica, SimClock  # noqa: E402
from tabletune.sim.scenario import load_scenario  # noqa: E402
from tabletune.solver import build_table, evaluate_table  # noqa: E402

CONVERGED = 0.015


def default_profile() -> Path:
    """The profile the demo runs, which the committed results were computed on."""
    return choose_profile(ROOT)


def bench_repair(profile: Path, *, interval_s: float, horizon_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        rig = Rig("repair", profile, Path(tmp), LOOP__INTERVAL_S=str(interval_s))
        start = rig.sim_s
        converged_at: float | None = None
        pushes: list[float] = []
        worst: list[tuple[float, float | None]] = []
        while rig.sim_s - start < horizon_s:
            report = rig.controller.run_cycle()
            t = rig.sim_s - start
            if report.pushed:
                pushes.append(t)
            loss = worst_loss_vs_oracle(rig)
            worst.append((t, loss))
            if loss is not None and loss <= CONVERGED:
                converged_at = t if converged_at is None else converged_at
            else:
                converged_at = None
            rig.wall.t += interval_s
        truth = rig.truth()
    return {
        "scenario": "repair",
        "cycle_interval_s": interval_s,
        "horizon_s": horizon_s,
        "converged_at_s": converged_at,
        "goal_s": 60.0,
        "met": converged_at is not None and converged_at <= 60.0,
        "pushes_at_s": pushes,
        "starting_worst_loss": worst[0][1],
        "final_table": truth["table"],
        "oracle_table": truth["oracle_table"],
    }


def worst_loss_vs_oracle(rig: Rig) -> float | None:
    """max over B of 1 - G(running table) / G(oracle table), true acceptance, allowed k only
    (the truth endpoint's own worst loss is against every profiled k, captured or not)."""
    truth = rig.truth()
    if truth["table"] is None:
        return None
    ran = goodput_per_load(rig, truth["rates"], truth["table"])
    best = goodput_per_load(rig, truth["rates"], truth["oracle_table"])
    return max(1.0 - r / o for r, o in zip(ran, best, strict=True))


def goodput_per_load(rig: Rig, rates: Sequence[float], table: Any) -> tuple[float, ...]:
    engine = next(iter(rig.replicas.values())).engine
    return evaluate_table(
        engine.step_times,
        rates,
        [tuple(r) for r in table],
        max_batch=engine.max_num_seqs,
        max_k=engine.num_speculative_tokens,
    ).goodput


def switch_load(rig: Rig, before: Sequence[float], after: Sequence[float]) -> int:
    """The load (within the scenario's range) where the switch costs the old best table most."""
    engine = next(iter(rig.replicas.values())).engine
    tables = [
        build_table(
            engine.step_times, rates, allowed_k=engine.oracle_ks, max_batch=engine.max_num_seqs
        ).ranges
        for rates in (before, after)
    ]
    old, new = (goodput_per_load(rig, after, t) for t in tables)
    load = rig.scenario.load
    margin = rig.settings.plugin.hysteresis + 1  # the plugin holds k near table edges
    edges = {start for table in tables for start, _, _ in table[1:]}
    span = [
        b
        for b in range(max(1, load.low), load.high + 1)  # type: ignore[union-attr]
        if all(abs(b - edge) > margin for edge in edges)
    ]
    return max(span, key=lambda b: new[b - 1] / old[b - 1])


def mean_goodput(rig: Rig, rates: Sequence[float], table: Any, loads: range) -> float:
    engine = next(iter(rig.replicas.values())).engine
    evaluation = evaluate_table(
        engine.step_times,
        rates,
        [tuple(r) for r in table],
        max_batch=engine.max_num_seqs,
        max_k=engine.num_speculative_tokens,
    )
    return sum(evaluation.goodput[b - 1] for b in loads) / len(loads)


def bench_switch(profile: Path, *, interval_s: float, phase_s: float) -> dict[str, Any]:
    """The load is held where the switch costs the old best table most (``switch_load``), so
    the gap is real at the running load, the one the daemon optimises for."""
    with tempfile.TemporaryDirectory() as tmp:
        # Hysteresis 0: the engine runs exactly the table, so the number is the estimator's and
        # the decision's reaction (with h > 0 the plugin keeps k near edges by design).
        rig = Rig(
            "acceptance-switch",
            profile,
            Path(tmp),
            LOOP__INTERVAL_S=str(interval_s),
            PLUGIN__HYSTERESIS="0",
        )
        replica = next(iter(rig.replicas.values()))
        acceptance = rig.scenario.acceptance
        switch_at = float(acceptance.at_s)  # type: ignore[union-attr]
        before = tuple(acceptance.before)  # type: ignore[union-attr]
        after = tuple(acceptance.after)  # type: ignore[union-attr]
        load = switch_load(rig, before, after)
        replica.set_load(load)
        rig.wall.t += phase_s
        table_at_switch: Any = None
        while True:
            rig.controller.run_cycle()
            if rig.sim_s <= switch_at + 1e-9:
                table_at_switch = rig.truth()["table"]
            if rig.sim_s + interval_s > switch_at + 30.0 + 1e-9:
                break
            rig.wall.t += interval_s
        rig.wall.t += switch_at + 30.0 - rig.sim_s  # to exactly 30 s after the switch
        table_30 = rig.truth()["table"]
        engine = replica.engine
        oracle = build_table(
            engine.step_times, after, allowed_k=engine.oracle_ks, max_batch=engine.max_num_seqs
        ).ranges
        at_load = range(load, load + 1)
        everywhere = range(1, engine.max_num_seqs + 1)
        shares = {}
        for name, loads in (("at_running_load", at_load), ("uniform_all_loads", everywhere)):
            g_switch = mean_goodput(rig, after, table_at_switch, loads)
            g_30 = mean_goodput(rig, after, table_30, loads)
            g_oracle = mean_goodput(rig, after, oracle, loads)
            gap = g_oracle - g_switch
            shares[name] = {
                "gap_tokens_per_ms": gap,
                "share_recovered": None if gap <= 1e-12 else (g_30 - g_switch) / gap,
            }
    share = shares["at_running_load"]["share_recovered"]
    return {
        "scenario": f"acceptance-switch, load held at B={load}",
        "cycle_interval_s": interval_s,
        "first_cycle_at_s": phase_s,
        "plugin_hysteresis": 0,
        "rollbacks": rig.metrics_rollbacks(),
        "switch_at_s": switch_at,
        "rates_after": list(after),
        "table_at_switch": table_at_switch,
        "table_30s_after": table_30,
        "oracle_after": [list(r) for r in oracle],
        "shares": shares,
        "share_recovered": share,
        "goal": 0.98,
        "met": share is not None and share >= 0.98,
    }


def record_scale(
    profile: Path, replicas: int, cycles: int, workdir: Path, *, scenario_name: str = "repair"
) -> list[Path]:
    """Each replica's /metrics text at each cycle (the emulator's pure core)."""
    scenario, base_dir = load_scenario(scenario_name)
    wall = Wall()
    clock = SimClock(speed=1.0, start_wall=wall(), wall=wall)
    prof = resolve_profile(scenario, base_dir, profile)
    fleet = [
        Replica(scenario, prof, base_dir=base_dir, clock=clock, index=i) for i in range(replicas)
    ]
    loop = asyncio.new_event_loop()
    paths = []
    for cycle in range(cycles):
        wall.t += 15.0
        # Compressed, as bytes arrive over the wire: the replaying process then holds one
        # cycle's worth in a few MB and pays the decompression inside the timed cycle.
        texts = {
            f"sim://{i}": zlib.compress(loop.run_until_complete(r.metrics_text()))
            for i, r in enumerate(fleet)
        }
        path = workdir / f"cycle-{cycle}.pickle"
        path.write_bytes(pickle.dumps(texts))
        paths.append(path)
    return paths


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident memory (VmHWM: its peak; ru_maxrss would include the parent's
    peak across fork+exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def scale_child(
    profile: Path, paths: list[Path], scope: str, scenario_name: str = "repair"
) -> dict[str, Any]:
    """Runs in its own process: only the daemon (and one cycle's texts) in memory."""
    logs.configure(level="info", fmt="json", stream=open(os.devnull, "w"))  # noqa: SIM115
    rss_start = rss_mb()
    scenario, _ = load_scenario(scenario_name)
    replicas = list(pickle.loads(paths[0].read_bytes()))
    with tempfile.TemporaryDirectory() as tmp:
        settings = daemon_settings(profile, Path(tmp) / "state", ESTIMATOR__SCOPE=scope)
        current: dict[str, bytes] = {}
        source = DirectSource(
            settings=settings.source,
            replicas=replicas,
            fetch=lambda url: zlib.decompress(current[url]).decode(),
        )
        admins = {
            url: StateAdminClient(
                TableState.initial(
                    scenario.engine.starting_table,
                    num_speculative_tokens=scenario.engine.num_speculative_tokens,
                    max_num_seqs=scenario.engine.max_num_seqs,
                ),
                identity=EngineIdentity("0.26.0", "qwen3-4b"),
            )
            for url in replicas
        }
        wall = Wall()
        controller = Controller(
            settings=settings,
            source=source,
            pools=load_pools(settings.profile),
            admin_for=admins.__getitem__,
            alerts=AlertSink(settings=settings.alerts, condition_ttl_s=120),
            metrics=DaemonMetrics(),
            clock=wall,
            sleep=wall.sleep,
        )
        cycles = []
        for path in paths:
            current.clear()
            current.update(pickle.loads(path.read_bytes()))
            wall.t += 15.0
            started = time.perf_counter()
            report = controller.run_cycle()
            seconds = time.perf_counter() - started
            cycles.append(
                {
                    "seconds": seconds,
                    "observed": len(report.observed),
                    "rebuilt": len(report.rebuilt),
                    "pushed": len(report.pushed),
                }
            )
        current.clear()
    return {
        "replicas": len(replicas),
        "estimator_scope": scope,
        "cycles": cycles,
        "rss_at_start_mb": rss_start,
        "rss_at_end_mb": rss_mb(),
        "peak_rss_mb": rss_mb("VmHWM"),
        "note": "the first cycle only sets the scrape baseline; the second decides and pushes",
    }


def bench_scale(
    profile: Path,
    replicas: int,
    cycles: int,
    *,
    scenario_name: str = "repair",
    goal_rss_mb: float = 200.0,
) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        recorded_at = time.perf_counter()
        paths = record_scale(profile, replicas, cycles, Path(tmp), scenario_name=scenario_name)
        record_s = time.perf_counter() - recorded_at
        for scope in ("replica", "pool"):
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    str(profile),
                    scope,
                    scenario_name,
                    *[str(p) for p in paths],
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            result = json.loads(done.stdout.strip().splitlines()[-1])
            measured = [c["seconds"] for c in result["cycles"][1:]]
            result |= {
                "scenario": scenario_name,
                "emulator_record_s": record_s,
                "max_cycle_s": max(measured),
                "goal_cycle_s": 2.0,
                "goal_rss_mb": goal_rss_mb,
                "met": max(measured) <= 2.0 and result["peak_rss_mb"] <= goal_rss_mb,
            }
            results.append(result)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        profile, scope, scenario_name, *paths = args.child
        print(
            json.dumps(scale_child(Path(profile), [Path(p) for p in paths], scope, scenario_name))
        )
        return 0
    profile = args.profile or default_profile()
    started = time.perf_counter()
    repair = [bench_repair(profile, interval_s=i, horizon_s=300.0) for i in (5.0, 15.0)]
    phases = (0.0, 7.5) if args.quick else (0.0, 5.0, 10.0)
    switch = [bench_switch(profile, interval_s=15.0, phase_s=p) for p in phases]
    switch += [bench_switch(profile, interval_s=5.0, phase_s=p) for p in (0.0, 2.5)]
    scale = bench_scale(profile, 200 if args.quick else 1000, 4)
    payload = {
        "what": "daemon benchmarks on the emulator's pure core (bench/daemon_bench.py)",
        "command": " ".join(["bench/daemon_bench.py", *(argv or sys.argv[1:])]),
        **environment(engine_version="vLLM 0.26.0, emulated (tabletune sim); no GPU"),
        "profile": str(profile.relative_to(ROOT) if profile.is_relative_to(ROOT) else profile),
        "repair": repair,
        "switch": switch,
        "scale": scale,
        "wall_s": time.perf_counter() - started,
    }
    path = write_result("daemon_bench", payload, smoke=args.quick)
    print(
        json.dumps(
            {
                "repair": [(r["cycle_interval_s"], r["converged_at_s"]) for r in repair],
                "switch": [
                    (s["cycle_interval_s"], s["first_cycle_at_s"], s["share_recovered"])
                    for s in switch
                ],
                "scale": [
                    (s["estimator_scope"], s["max_cycle_s"], s["peak_rss_mb"]) for s in scale
                ],
            },
            indent=1,
        )
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
