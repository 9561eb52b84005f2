"""The real ``tabletune daemon`` process against a fleet of emulated engines in another
process (``tabletune sim serve --ports A-B``, the demo's scenario: each engine starts with a
table the daemon replaces at first sight), over real HTTP; written to
bench/results/fleet_bench.json.

1. faults: 200 replicas, 5 of them answering late (10 s: the admin API, /metrics, or both) or
   answering 503; default settings (15 s cycles, 5 s timeouts). Per case: each cycle's duration,
   when the healthy replicas' tables were pushed (seconds into the cycle), stale-data and
   push-failed alerts about healthy replicas, /healthz answers, and SIGTERM's time to exit
   (sent 3 s into a cycle: while the daemon waits for the late ones, or retries).
2. scale: 1,000 replicas; the daemon's cycle time (goal <= 2 s) and resident memory (goal
   <= 300 MB), the emulator on the same machine.

    .venv/bin/python bench/fleet_bench.py                 # both
    .venv/bin/python bench/fleet_bench.py --part faults   # or scale
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, environment, goal, write_result  # noqa: E402
from bench.fleet import Daemon, set_faults, stamp, start_daemon, start_emulator  # noqa: E402
from bench.sim_scale import consecutive_free_ports  # noqa: E402

CASES: dict[str, dict[str, object]] = {
    "none": {},
    "admin_latency": {"admin_latency_s": 10},
    "slow_scrape": {"metrics_delay_s": 10},
    "both_late": {"admin_latency_s": 10, "metrics_delay_s": 10},
    "admin_503": {"admin_error_status": 503},
}


def watch(daemon: Daemon, cycles: int, *, interval_s: float) -> dict[str, Any]:
    """Poll /healthz and memory until ``cycles`` cycles ended."""
    statuses: list[int] = []
    rss: list[float] = []
    deadline = time.monotonic() + (cycles + 2) * interval_s + 60
    while len(daemon.cycles()) < cycles and time.monotonic() < deadline:
        statuses.append(daemon.healthz())
        rss.append(daemon.rss_mib())
        time.sleep(0.5)
    return {"healthz": statuses, "rss_mib": rss}


def sigterm_into_cycle(daemon: Daemon, into_s: float, interval_s: float) -> dict[str, Any]:
    starts = daemon.cycle_starts()
    target = starts[0] + interval_s * (len(starts)) + into_s
    while target < time.time():
        target += interval_s
    time.sleep(target - time.time())
    seconds, code = daemon.stop()
    stopped = daemon.events("daemon stopped; state saved")
    return {
        "sent_s_into_cycle": into_s,
        "exit_s": seconds,
        "exit_code": code,
        "saved": bool(stopped),
    }


def fault_case(
    name: str, workdir: Path, *, replicas: int, late: int, cycles: int, interval_s: float
) -> dict[str, Any]:
    base = consecutive_free_ports(replicas + 1)
    ports = list(range(base, base + replicas))
    emulator = start_emulator(ports, workdir / "sim.log")
    try:
        urls = emulator.urls
        faulty = urls[:: replicas // late][:late]
        for url in faulty:
            if CASES[name]:
                set_faults(url, **CASES[name])
        daemon = start_daemon(
            workdir,
            base + replicas,
            SOURCE__REPLICAS=",".join(urls),
            LOOP__INTERVAL_S=f"{interval_s:g}",
        )
        try:
            seen = watch(daemon, cycles, interval_s=interval_s)
            stop = sigterm_into_cycle(daemon, 3.0, interval_s)
        finally:
            if daemon.process.poll() is None:
                daemon.process.kill()
        healthy = set(urls) - set(faulty)
        done = daemon.cycles()
        starts = [stamp(e) - e["seconds"] for e in done]
        pushes = [
            (e["replica"], stamp(e))
            for e in daemon.events("table pushed")
            if e["replica"] in healthy
        ]
        push_offsets = [at - max(s for s in starts if s <= at) for _, at in pushes]
        fired = [(e["alertname"], e["replica"]) for e in daemon.events("alert firing")]
        return {
            "case": name,
            "late_replicas": faulty if CASES[name] else [],
            "faults": CASES[name],
            "cycles": [cycle_row(e) for e in done],
            "healthy_pushed": len({r for r, _ in pushes}),
            "healthy": len(healthy),
            "healthy_push_s_into_cycle_max": max(push_offsets, default=None),
            "stale_alerts_about_healthy": sum(
                1 for n, r in fired if n == "TableTuneStaleData" and r in healthy
            ),
            "push_failed_alerts_about_healthy": sum(
                1 for n, r in fired if n == "TableTunePushFailed" and r in healthy
            ),
            "alerts_about_late": sorted({n for n, r in fired if r in faulty}),
            "healthz_not_200": sum(1 for s in seen["healthz"] if s != 200),
            "healthz_polls": len(seen["healthz"]),
            "peak_rss_mib": max(seen["rss_mib"], default=None),
            "sigterm": stop,
        }
    finally:
        emulator.stop()


def cycle_row(entry: dict[str, Any]) -> dict[str, Any]:
    """A 'cycle done' log record in the result: its time and how many replicas fared how."""
    return {
        "seconds": entry["seconds"],
        "observed": entry["observed"],
        "problems": len(entry["problems"]),
        "failed": len(entry["failed"]),
        "pushed": len(entry["pushed"]),
    }


def bench_faults(replicas: int, late: int, cycles: int, interval_s: float) -> list[dict[str, Any]]:
    out = []
    for name in CASES:
        with tempfile.TemporaryDirectory(prefix=f"fleet-{name}-") as tmp:
            result = fault_case(
                name, Path(tmp), replicas=replicas, late=late, cycles=cycles, interval_s=interval_s
            )
        print(json.dumps({k: result[k] for k in ("case", "healthy_pushed", "sigterm")}))
        out.append(result)
    return out


def bench_scale(replicas: int, cycles: int, interval_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fleet-scale-") as tmp:
        workdir = Path(tmp)
        base = consecutive_free_ports(replicas + 1)
        emulator = start_emulator(list(range(base, base + replicas)), workdir / "sim.log")
        try:
            daemon = start_daemon(
                workdir,
                base + replicas,
                SOURCE__REPLICAS=",".join(emulator.urls),
                LOOP__INTERVAL_S=f"{interval_s:g}",
            )
            cpu0 = daemon.cpu_s()
            seen = watch(daemon, cycles, interval_s=interval_s)
            cpu = daemon.cpu_s() - cpu0
            peak = daemon.peak_rss_mib()
            stop = sigterm_into_cycle(daemon, 3.0, interval_s)
            done = daemon.cycles()
            daemon_events = daemon.events()
        finally:
            emulator.stop()
    seconds = [e["seconds"] for e in done]
    return {
        "replicas": replicas,
        "cycle_interval_s": interval_s,
        "cycles": [{**cycle_row(e), "deferred": e["deferred"]} for e in done],
        "scrapes_left_for_next_cycle": sum(
            e["replicas"] for e in daemon_events if e["event"].startswith("scrapes left")
        ),
        "max_cycle_s": max(seconds),
        "steady_cycle_s": sorted(seconds[2:])[len(seconds[2:]) // 2] if len(seconds) > 2 else None,
        "goal_cycle_s": 2.0,
        "daemon_cpu_s_per_cycle": cpu / max(1, len(done)),
        "rss_mib_samples": [round(r, 1) for r in seen["rss_mib"]],
        "peak_rss_mib": peak,
        "goal_rss_mib": 300.0,
        "healthz_not_200": sum(1 for s in seen["healthz"] if s != 200),
        "sigterm": stop,
        "note": (
            "the first cycle only sets the scrape baseline; the second reads every table and "
            "pushes 1,000; the emulator (1,000 engines, one process) runs on the same 2 cores"
        ),
    }


TIMEOUT_S = 5.0  # SOURCE__TIMEOUT_S and ADMIN__TIMEOUT_S, their defaults
SIGTERM_GOAL_S = 10.0
CYCLE_GOAL_S = 2.0
RSS_GOAL_MIB = 300.0


def fleet_goals(payload: dict[str, Any]) -> dict[str, Any]:
    """The issue's goals, judged from the figures the parts wrote."""
    goals: dict[str, Any] = {}
    faults = payload.get("faults")
    if faults:
        calm = next(c for c in faults if c["case"] == "none")["healthy_push_s_into_cycle_max"]
        late_cases = [c for c in faults if c["case"] != "none"]
        added = max(c["healthy_push_s_into_cycle_max"] for c in late_cases) - calm
        goals["healthy_replicas_all_pushed"] = goal(
            {c["case"]: f"{c['healthy_pushed']}/{c['healthy']}" for c in faults},
            "every healthy replica, in every case",
            all(c["healthy_pushed"] == c["healthy"] for c in faults),
        )
        goals["healthy_delay_added_s"] = goal(
            round(added, 2), f"<= one timeout ({TIMEOUT_S:g} s)", added <= TIMEOUT_S
        )
        false_alerts = sum(
            c["stale_alerts_about_healthy"] + c["push_failed_alerts_about_healthy"] for c in faults
        )
        goals["false_alerts_about_healthy"] = goal(false_alerts, "0", false_alerts == 0)
        not_200 = sum(c["healthz_not_200"] for c in faults)
        goals["healthz_not_200"] = goal(not_200, "0", not_200 == 0)
    sigterms = [c["sigterm"] for c in faults or []]
    if payload.get("scale"):
        sigterms.append(payload["scale"]["sigterm"])
    if sigterms:
        worst = max(t["exit_s"] for t in sigterms)
        goals["sigterm_exit_s_worst"] = goal(
            round(worst, 2),
            f"<= {SIGTERM_GOAL_S:g} s, exit 0, state saved",
            worst <= SIGTERM_GOAL_S and all(t["exit_code"] == 0 and t["saved"] for t in sigterms),
        )
    scale = payload.get("scale")
    if scale:
        goals["scale_cycle_s_max"] = goal(
            scale["max_cycle_s"], f"<= {CYCLE_GOAL_S:g} s", scale["max_cycle_s"] <= CYCLE_GOAL_S
        )
        goals["scale_peak_rss_mib"] = goal(
            round(scale["peak_rss_mib"], 1),
            f"<= {RSS_GOAL_MIB:g} MiB",
            scale["peak_rss_mib"] <= RSS_GOAL_MIB,
        )
    return goals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=("faults", "scale", "both"), default="both")
    parser.add_argument("--replicas", type=int, default=200)
    parser.add_argument("--late", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--scale-replicas", type=int, default=1000)
    parser.add_argument("--scale-cycles", type=int, default=6)
    parser.add_argument("--interval", type=float, default=15.0, help="LOOP__INTERVAL_S")
    parser.add_argument("--out", default="fleet_bench", help="result name in bench/results/")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    payload: dict[str, Any] = {
        "what": "the tabletune daemon process vs emulator processes over HTTP",
        "command": " ".join(["bench/fleet_bench.py", *(argv or sys.argv[1:])]),
        **environment(engine_version="vLLM 0.26.0, emulated (tabletune sim); no GPU"),
        "machine": "2 CPU cores shared with other work; emulator and daemon on the same cores",
    }
    if args.part in ("faults", "both"):
        payload["faults"] = bench_faults(args.replicas, args.late, args.cycles, args.interval)
    if args.part in ("scale", "both"):
        payload["scale"] = bench_scale(args.scale_replicas, args.scale_cycles, args.interval)
    payload["wall_s"] = time.perf_counter() - started
    # One part at a time keeps the other's figures from an earlier run.
    earlier = RESULTS / f"{args.out}.json"
    if args.part != "both" and earlier.exists():
        kept = json.loads(earlier.read_text(encoding="utf-8"))
        payload = {**{k: kept[k] for k in ("faults", "scale") if k in kept}, **payload}
    payload["goals"] = fleet_goals(payload)
    print(f"wrote {write_result(args.out, payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
