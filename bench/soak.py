"""Soak: the real ``tabletune daemon`` process for a long while against 200 emulated engines
that restart, hang, leave and join, with a real Alertmanager that restarts too; written to
bench/results/soak.json.

The engines run in groups of 40, one emulator process per group (``tabletune sim serve
--ports A-B``, the demo's scenario); five groups run at a time and a sixth is out. The daemon
reads all 240 addresses (the ones out refuse connections, as deleted pods do) through a real
Prometheus scraping them (``--source prometheus``, the default) or directly (``--source
direct``). A fault comes every ``--fault-every`` seconds, in turn:

- restarts: 10 running engines restart (10 s down; counters from zero, the starting table back);
- hangs: 5 running engines answer /metrics and the admin API 30 s late, for 45 s;
- churn: a running group leaves (its process killed) and the group that was out joins;
- alertmanager: Alertmanager restarts (it keeps alerts in memory only);
- prometheus (Prometheus source only): Prometheus is down for 60 s, then back on its database.

Judged: the daemon never exits nor fails a cycle; /healthz stays 200; its resident memory has
no trend (a straight line fitted over the run, and over its second half, in MB per hour);
``LOOP__FORGET_AFTER_S`` after a group left, neither Alertmanager nor the daemon's /metrics
hold anything about its engines; Alertmanager's table-shift events are back after its restart.

    .venv/bin/python bench/soak.py --minutes 60
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from bench.common import environment, goal, write_result  # noqa: E402
from bench.fleet import (  # noqa: E402
    Alertmanager,
    Daemon,
    Emulator,
    Prometheus,
    set_faults,
    start_daemon,
    start_emulator,
)
from bench.sim_scale import consecutive_free_ports  # noqa: E402

FAULTS = ("restarts", "hangs", "churn", "alertmanager", "prometheus")
PROMETHEUS_DOWN_S = 60.0


@dataclass
class Fleet:
    """The engine groups: which run, which is out."""

    workdir: Path
    base: int
    size: int
    groups: int
    running: dict[int, Emulator] = field(default_factory=dict)

    def ports(self, group: int) -> list[int]:
        start = self.base + group * self.size
        return list(range(start, start + self.size))

    def urls(self, group: int) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports(group)]

    @property
    def every_url(self) -> list[str]:
        return [url for g in range(self.groups) for url in self.urls(g)]

    def start(self, group: int) -> None:
        log = self.workdir / f"sim-{group}.log"
        self.running[group] = start_emulator(self.ports(group), log)

    def stop(self, group: int) -> None:
        self.running.pop(group).stop()

    def running_urls(self) -> list[str]:
        return [url for g in sorted(self.running) for url in self.urls(g)]


def sample(daemon: Daemon, am: Alertmanager, t0: float) -> dict[str, Any]:
    row: dict[str, Any] = {
        "t_s": round(time.time() - t0, 1),
        "alive": daemon.process.poll() is None,
    }
    if not row["alive"]:
        return row
    row["rss_mib"] = round(daemon.rss_mib(), 2)
    row["healthz"] = daemon.healthz()
    try:
        samples = daemon.metrics()
        row["cycles_ok"] = sum(
            v
            for n, lab, v in samples
            if n == "tabletune_daemon_cycles_total" and lab.get("outcome") == "ok"
        )
        row["cycles_failed"] = sum(
            v
            for n, lab, v in samples
            if n == "tabletune_daemon_cycles_total" and lab.get("outcome") == "failed"
        )
        row["replica_series"] = sum(1 for _, lab, _ in samples if lab.get("replica"))
    except httpx.HTTPError as error:
        row["metrics_error"] = str(error)
    try:
        row["alertmanager_alerts"] = len(am.alerts())
    except httpx.HTTPError:
        row["alertmanager_alerts"] = None  # restarting
    return row


def about(daemon: Daemon, am: Alertmanager, urls: set[str]) -> dict[str, int]:
    """What Alertmanager and the daemon's /metrics still hold about ``urls``. A replica is
    named by its URL when scraped directly, by its ``instance`` (host:port) through Prometheus."""
    names = urls | {url.removeprefix("http://") for url in urls}
    alerts = [a for a in am.alerts() if a["labels"].get("replica") in names]
    series = [1 for _, labels, _ in daemon.metrics() if labels.get("replica") in names]
    return {"alertmanager_alerts": len(alerts), "daemon_series": len(series)}


def event_kind(entry: dict[str, Any]) -> str:
    """A log record's event with what varies per record (times, counts in parentheses) left
    out, so a library's message counts as one kind."""
    return re.sub(r"\([^()]*(\([^()]*\))?[^()]*\)", "(…)", str(entry.get("event")))


def slope_mib_per_hour(rows: list[dict[str, Any]]) -> float | None:
    points = [(r["t_s"] / 3600, r["rss_mib"]) for r in rows if "rss_mib" in r]
    if len(points) < 3:
        return None
    t, rss = np.array(points).T
    return float(np.polyfit(t, rss, 1)[0])


# "RSS slope about 0", judged over the second half of the run (after warm-up): at 5 MiB an
# hour the daemon would take over two days to grow from ~150 MiB to a 512 Mi container limit.
RSS_SLOPE_GOAL_MIB_PER_HOUR = 5.0


def soak_goals(payload: dict[str, Any]) -> dict[str, Any]:
    slope = payload["rss_mib"]["slope_mib_per_hour_second_half"]
    return {
        "crashes": goal(payload["crashes"], "0", payload["crashes"] == 0),
        "cycles_failed": goal(payload["cycles_failed"], "0", payload["cycles_failed"] == 0),
        "healthz_not_200": goal(payload["healthz_not_200"], "0", payload["healthz_not_200"] == 0),
        "rss_slope_second_half_mib_per_hour": goal(
            slope,
            f"|slope| <= {RSS_SLOPE_GOAL_MIB_PER_HOUR:g}",
            slope is not None and abs(slope) <= RSS_SLOPE_GOAL_MIB_PER_HOUR,
        ),
        "broken_log_lines": goal(
            payload["broken_log_lines"], "0", payload["broken_log_lines"] == 0
        ),
        "left_groups_cleared_after_forget": goal(
            payload["left_groups_cleared_after_forget"],
            "alerts resolved and series gone for every group that left",
            payload["left_groups_cleared_after_forget"],
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--fault-every", type=float, default=90.0, help="seconds")
    parser.add_argument("--interval", type=float, default=5.0, help="LOOP__INTERVAL_S")
    parser.add_argument("--forget-after", type=float, default=60.0, help="LOOP__FORGET_AFTER_S")
    parser.add_argument("--group-size", type=int, default=40)
    parser.add_argument("--groups", type=int, default=6, help="one of them out at a time")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--source", choices=("prometheus", "direct"), default="prometheus")
    parser.add_argument("--out", default="soak", help="result name in bench/results/")
    args = parser.parse_args(argv)
    # SIGTERM ends the run like Ctrl-C: the engines, Prometheus and Alertmanager it started
    # are stopped on the way out (a background job ignores SIGINT).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    faults = FAULTS if args.source == "prometheus" else FAULTS[:-1]
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    base = consecutive_free_ports(args.groups * args.group_size + 3)
    fleet = Fleet(workdir, base, args.group_size, args.groups)
    am = Alertmanager(port=base + args.groups * args.group_size + 1, workdir=workdir)
    am.start()
    for group in range(args.groups - 1):
        fleet.start(group)
    out = args.groups - 1
    prom: Prometheus | None = None
    if args.source == "prometheus":
        prom = Prometheus(
            port=base + args.groups * args.group_size + 2,
            workdir=workdir,
            targets=[url.removeprefix("http://") for url in fleet.every_url],
        )
        prom.start()
        source = {"SOURCE__PROMETHEUS_URL": prom.url}
    else:
        source = {"SOURCE__REPLICAS": ",".join(fleet.every_url)}
    daemon = start_daemon(
        workdir,
        base + args.groups * args.group_size,
        **source,
        LOOP__INTERVAL_S=f"{args.interval:g}",
        LOOP__FORGET_AFTER_S=f"{args.forget_after:g}",
        ALERTS__ALERTMANAGER_URL=am.url,
    )
    t0 = time.time()
    end = t0 + 60 * args.minutes
    rows: list[dict[str, Any]] = []
    timeline: list[dict[str, Any]] = []
    left: list[dict[str, Any]] = []  # groups that left, checked once forgotten
    clear_at: list[tuple[float, list[str]]] = []
    next_fault = t0 + args.fault_every
    prometheus_back_at: float | None = None
    turn = 0
    try:
        while time.time() < end and daemon.process.poll() is None:
            now = time.time()
            rows.append(sample(daemon, am, t0))
            for at, urls in [c for c in clear_at if c[0] <= now]:
                clear_at.remove((at, urls))
                for url in urls:
                    with contextlib.suppress(httpx.HTTPError):  # its group may have left
                        set_faults(url, clear=True)
            if prom is not None and prometheus_back_at is not None and now >= prometheus_back_at:
                prom.start()
                prometheus_back_at = None
            for entry in left:
                due = entry["left_at"] + args.forget_after + 3 * args.interval
                if "after_forget" not in entry and now >= due:
                    entry["after_forget"] = about(daemon, am, set(entry["urls"]))
                    entry["checked_s_after_leaving"] = round(now - entry["left_at"], 1)
            if now >= next_fault:
                kind = faults[turn % len(faults)]
                turn += 1
                event: dict[str, Any] = {"t_s": round(now - t0, 1), "fault": kind}
                if kind == "restarts":
                    chosen = rng.sample(fleet.running_urls(), 10)
                    for url in chosen:
                        httpx.post(f"{url}/sim/v1/restart", json={"downtime_s": 10}, timeout=10)
                    event["engines"] = chosen
                elif kind == "hangs":
                    chosen = rng.sample(fleet.running_urls(), 5)
                    for url in chosen:
                        set_faults(url, admin_latency_s=30, metrics_delay_s=30)
                    clear_at.append((now + 45, chosen))
                    event["engines"] = chosen
                elif kind == "churn":
                    leaving = rng.choice(sorted(fleet.running))
                    before = about(daemon, am, set(fleet.urls(leaving)))
                    fleet.stop(leaving)
                    fleet.start(out)
                    left.append(
                        {
                            "group": leaving,
                            "urls": fleet.urls(leaving),
                            "left_at": time.time(),
                            "left_at_s": round(time.time() - t0, 1),
                            "before_leaving": before,
                        }
                    )
                    event.update(left=leaving, joined=out)
                    out = leaving
                elif kind == "prometheus":
                    assert prom is not None
                    prom.stop()  # back PROMETHEUS_DOWN_S later; the sampling goes on
                    prometheus_back_at = now + PROMETHEUS_DOWN_S
                    event["down_s"] = PROMETHEUS_DOWN_S
                else:
                    shifts_before = sum(
                        1
                        for a in am.alerts()
                        if a["labels"]["alertname"] == "TableTuneTableShifted"
                    )
                    am.stop()
                    am.start()
                    time.sleep(2 * args.interval)
                    event["table_shift_events_before"] = shifts_before
                    event["table_shift_events_after_restart"] = sum(
                        1
                        for a in am.alerts()
                        if a["labels"]["alertname"] == "TableTuneTableShifted"
                    )
                timeline.append(event)
                print(json.dumps({k: v for k, v in event.items() if k != "engines"}), flush=True)
                next_fault += args.fault_every
            time.sleep(max(0.0, 5.0 - (time.time() - now)))
        crashed = daemon.process.poll() is not None
        final = rows[-1] if rows else {}
        peak = None if crashed else daemon.peak_rss_mib()
        stop_s, code = (None, daemon.process.returncode) if crashed else daemon.stop()
        logged = Counter(event_kind(e) for e in daemon.events())
        broken_log_lines = daemon.broken_log_lines()
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
        for group in list(fleet.running):
            fleet.stop(group)
        am.stop()
        if prom is not None:
            prom.stop()
    duration_s = time.time() - t0
    live = [r for r in rows if "rss_mib" in r]
    half = [r for r in live if r["t_s"] >= duration_s / 2]
    checked = [e for e in left if "after_forget" in e]
    payload = {
        "what": "the tabletune daemon process under restarts, hangs, churn, Alertmanager restarts",
        "command": " ".join(["bench/soak.py", *(argv or sys.argv[1:])]),
        **environment(engine_version="vLLM 0.26.0, emulated (tabletune sim); no GPU"),
        "machine": "2 CPU cores shared with other work",
        "duration_s": round(duration_s),
        "settings": {
            "replicas_running": (args.groups - 1) * args.group_size,
            "addresses_scraped": args.groups * args.group_size,
            "loop_interval_s": args.interval,
            "forget_after_s": args.forget_after,
            "fault_every_s": args.fault_every,
            "source": args.source,
            "seed": args.seed,
        },
        "crashes": int(crashed),
        "exit_code": code,
        "sigterm_exit_s": stop_s,
        "cycles_ok": final.get("cycles_ok"),
        "cycles_failed": final.get("cycles_failed"),
        "healthz_not_200": sum(1 for r in live if r.get("healthz") != 200),
        "samples": len(rows),
        "rss_mib": {
            "first": live[0]["rss_mib"] if live else None,
            "last": live[-1]["rss_mib"] if live else None,
            "min": min((r["rss_mib"] for r in live), default=None),
            "max": max((r["rss_mib"] for r in live), default=None),
            "slope_mib_per_hour_whole_run": slope_mib_per_hour(live),
            "slope_mib_per_hour_second_half": slope_mib_per_hour(half),
            "peak": peak,
        },
        "groups_left": [{k: v for k, v in e.items() if k not in ("urls", "left_at")} for e in left],
        "left_groups_cleared_after_forget": bool(checked)
        and all(
            e["after_forget"] == {"alertmanager_alerts": 0, "daemon_series": 0} for e in checked
        ),
        "faults": timeline,
        # what the daemon did, from its JSON log (pushes, rollbacks, restarts seen, forgets)
        "daemon_log_events": {name: logged[name] for name in sorted(logged) if logged[name]},
        "broken_log_lines": broken_log_lines,
        "series": [
            {
                k: r.get(k)
                for k in (
                    "t_s",
                    "rss_mib",
                    "healthz",
                    "cycles_ok",
                    "replica_series",
                    "alertmanager_alerts",
                )
            }
            for r in rows[:: max(1, len(rows) // 400)]
        ],
    }
    payload["goals"] = soak_goals(payload)
    path = write_result(args.out, payload)
    print(
        json.dumps(
            {
                k: payload[k]
                for k in (
                    "duration_s",
                    "crashes",
                    "cycles_failed",
                    "healthz_not_200",
                    "rss_mib",
                    "left_groups_cleared_after_forget",
                    "goals",
                )
            },
            indent=1,
        )
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
