"""How much 1,000 emulated engines in one process cost: start-up, scrape rounds, CPU, memory,
and (optionally) a real Prometheus scraping all of them every second.

    .venv/bin/python bench/sim_scale.py --replicas 1000 --speed 1 --prometheus \
        --out bench/results/sim-scale-1000.json

Before/after: run it on the older code first (PYTHONPATH=OLD/src, ``--label OLD``), then pass
that JSON as ``--before``: the result holds it and the ratios of the main figures (after/before).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")


def consecutive_free_ports(count: int) -> int:
    for base in range(20_000, 60_000 - count, 997):
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no free port range")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def scrape_round(client: httpx.AsyncClient, urls: list[str], limit: int) -> list[float]:
    gate = asyncio.Semaphore(limit)
    times: list[float] = []

    async def one(url: str) -> None:
        async with gate:
            start = time.perf_counter()
            response = await client.get(url)
            response.raise_for_status()
            times.append(time.perf_counter() - start)

    await asyncio.gather(*(one(u) for u in urls))
    return times


async def wait_ready(urls: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2.0) as client:
        for url in (urls[0], urls[-1]):
            while True:
                try:
                    if (await client.get(url)).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(url)
                await asyncio.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--scenario", default="steady")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--prometheus", action="store_true", help="also a real Prometheus, 1 s")
    parser.add_argument("--prometheus-seconds", type=float, default=20.0)
    parser.add_argument("--scrape-interval", type=int, default=1, help="Prometheus, seconds")
    parser.add_argument("--label", default="this checkout", help="which code this run measured")
    parser.add_argument("--before", type=Path, help="this script's JSON from the older code")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    base = consecutive_free_ports(args.replicas)
    ports = list(range(base, base + args.replicas))
    workdir = Path(tempfile.mkdtemp(prefix="sim-scale-"))
    log = (workdir / "sim.log").open("wb")
    command = [
        sys.executable, "-m", "tabletune.cli.main", "sim", "serve", "--scenario", args.scenario,
        "--ports", f"{ports[0]}-{ports[-1]}", "--speed", str(args.speed),
    ]  # fmt: skip
    started = time.perf_counter()
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    result: dict[str, object] = {}
    try:
        asyncio.run(wait_ready([f"http://127.0.0.1:{p}/health" for p in ports], 120))
        startup_s = time.perf_counter() - started
        idle_rss = rss_mib(server.pid)
        metrics_urls = [f"http://127.0.0.1:{p}/metrics" for p in ports]

        async def rounds() -> list[dict[str, float]]:
            out = []
            limits = httpx.Limits(max_connections=args.concurrency)
            async with httpx.AsyncClient(timeout=30.0, limits=limits) as client:
                for _ in range(args.rounds):
                    cpu0, t0 = cpu_seconds(server.pid), time.perf_counter()
                    times = await scrape_round(client, metrics_urls, args.concurrency)
                    wall = time.perf_counter() - t0
                    cpu = cpu_seconds(server.pid) - cpu0
                    out.append(
                        {
                            "round_wall_s": wall,
                            "server_cpu_s": cpu,
                            "scrape_p50_ms": 1000 * float(np.percentile(times, 50)),
                            "scrape_p99_ms": 1000 * float(np.percentile(times, 99)),
                        }
                    )
                    await asyncio.sleep(max(0.0, 1.0 - wall))
            return out

        scrape_rounds = asyncio.run(rounds())
        result = {
            "what": "tabletune sim serve: N engines in one process, one port each",
            "code": args.label,
            "command": " ".join(command[1:]),
            "replicas": args.replicas,
            "speed": args.speed,
            "scenario": args.scenario,
            "startup_s": startup_s,
            "rss_mib_after_start": idle_rss,
            "scrape_rounds": scrape_rounds,
            "rss_mib_after_rounds": rss_mib(server.pid),
        }
        if args.prometheus and shutil.which("prometheus"):
            result["prometheus"] = run_prometheus(
                workdir, ports, server.pid, args.prometheus_seconds, args.scrape_interval
            )
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    if args.before:
        earlier = json.loads(args.before.read_text(encoding="utf-8"))
        result["after_over_before"] = compare(result, earlier)
        result["before"] = earlier
    result |= {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": f"CPU only: {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "engine": "tabletune sim (emulated vLLM 0.26.0); no GPU, no vLLM",
        "python": platform.python_version(),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


def figures(result: dict[str, Any]) -> dict[str, float]:
    """The figures a before/after comparison looks at (medians over the scrape rounds)."""
    rounds = result["scrape_rounds"]
    out = {
        "startup_s": result["startup_s"],
        "rss_mib_after_rounds": result["rss_mib_after_rounds"],
        "round_server_cpu_s": float(np.median([r["server_cpu_s"] for r in rounds])),
        "round_scrape_p99_ms": float(np.median([r["scrape_p99_ms"] for r in rounds])),
    }
    prometheus = result.get("prometheus") or {}
    for key in ("server_cpu_fraction", "scrape_duration_p99_s", "targets_up"):
        if key in prometheus:
            out[f"prometheus_{key}"] = prometheus[key]
    return out


def compare(after: dict[str, Any], before: dict[str, Any]) -> dict[str, float]:
    mine, theirs = figures(after), figures(before)
    return {key: mine[key] / theirs[key] for key in mine.keys() & theirs.keys() if theirs[key]}


def run_prometheus(
    workdir: Path, ports: list[int], pid: int, seconds: float, interval: int
) -> dict[str, object]:
    prom_port = consecutive_free_ports(1)
    config = {
        "global": {"scrape_interval": f"{interval}s", "scrape_timeout": f"{interval}s"},
        "scrape_configs": [
            {"job_name": "vllm", "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}]}
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{prom_port}"
    try:
        for _ in range(100):
            try:
                if httpx.get(f"{url}/-/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        cpu0, prom_cpu0 = cpu_seconds(pid), cpu_seconds(prom.pid)
        time.sleep(seconds)
        cpu = cpu_seconds(pid) - cpu0
        prom_cpu = cpu_seconds(prom.pid) - prom_cpu0

        def value(expr: str) -> float:
            data = httpx.get(f"{url}/api/v1/query", params={"query": expr}).json()["data"]
            return float(data["result"][0]["value"][1]) if data["result"] else float("nan")

        return {
            "scrape_interval_s": interval,
            "seconds": seconds,
            "targets_up": value("count(up == 1)"),
            "targets_down": value("count(up == 0)"),
            "scrape_duration_p99_s": value("quantile(0.99, scrape_duration_seconds)"),
            "server_cpu_fraction": cpu / seconds,
            "prometheus_cpu_fraction": prom_cpu / seconds,
            "drafts_per_s_all_engines": value("sum(rate(vllm:spec_decode_num_drafts_total[10s]))"),
        }
    finally:
        prom.terminate()
        prom.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
