"""Drive a running vLLM 0.26 (+ TableTune plugin) and check the plugin against vLLM's counters.

Standard library + httpx + prometheus_client (all on the GPU host's image). Phases:
  wait        wait for /health (exit 1 if the server process dies or time runs out)
  main        GET/PUT per k, per-position counters vs vLLM's, acceptance, invalid PUTs,
              exploration, then the throughput arm "A" (plugin loaded)
  throughput  only the throughput arm (label given), e.g. "B" without the plugin
Writes one JSON per phase (device, engine version, date, config, every check).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

TABLE_PATH = "/tabletune/v1/table"
SETTINGS_PATH = "/tabletune/v1/settings"
Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(base: str) -> Sample:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    samples: Sample = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def total(samples: Sample, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def delta(after: Sample, before: Sample, name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


async def _one(client: httpx.AsyncClient, model: str, prompt_len: int, max_tokens: int) -> int:
    prompt = [random.randrange(100, 30000) for _ in range(prompt_len)]
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    response = await client.post("/v1/completions", json=body)
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


async def load(
    base: str, model: str, *, requests: int, concurrency: int, max_tokens: int, prompt_len: int = 64
) -> dict[str, float]:
    """``requests`` completions, at most ``concurrency`` in flight (one client for every arm)."""
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:
        gate = asyncio.Semaphore(concurrency)

        async def gated() -> int:
            async with gate:
                return await _one(client, model, prompt_len, max_tokens)

        start = time.perf_counter()
        tokens = await asyncio.gather(*(gated() for _ in range(requests)))
        wall = time.perf_counter() - start
    return {"requests": requests, "tokens": float(sum(tokens)), "wall_s": wall}


async def closed_loop(
    base: str,
    model: str,
    *,
    concurrency: int,
    max_tokens: int,
    warmup_s: float,
    windows: int,
    window_s: float,
) -> list[dict[str, float]]:
    """Keep ``concurrency`` requests in flight; measure generated tokens/s per window from
    vLLM's own counter, plus the running-requests gauge and drafts per step."""
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:

        async def worker() -> None:
            while not stop.is_set():
                await _one(client, model, 64, max_tokens)

        tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
        await asyncio.sleep(warmup_s)
        results = []
        for _ in range(windows):
            before, t0 = await asyncio.to_thread(scrape, base), time.perf_counter()
            running = []
            end = t0 + window_s
            while time.perf_counter() < end:
                await asyncio.sleep(min(1.0, max(0.0, end - time.perf_counter())))
                snap = await asyncio.to_thread(scrape, base)
                running.append(total(snap, "vllm:num_requests_running"))
            after, t1 = await asyncio.to_thread(scrape, base), time.perf_counter()
            drafts = delta(after, before, "vllm:spec_decode_num_drafts_total")
            results.append(
                {
                    "tokens_per_s": delta(after, before, "vllm:generation_tokens_total")
                    / (t1 - t0),
                    "wall_s": t1 - t0,
                    "mean_running": statistics.fmean(running) if running else 0.0,
                    "draft_tokens_per_draft": (
                        delta(after, before, "vllm:spec_decode_num_draft_tokens_total") / drafts
                        if drafts
                        else 0.0
                    ),
                }
            )
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return results


class Checker:
    def __init__(self) -> None:
        self.checks: list[dict[str, Any]] = []

    def check(self, name: str, ok: bool, **detail: Any) -> bool:
        self.checks.append({"name": name, "ok": bool(ok), **detail})
        print(
            ("PASS " if ok else "FAIL ") + name + " " + json.dumps(detail, default=str), flush=True
        )
        return ok


def admin(base: str, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=base, headers=headers, timeout=30)


def invalid_puts(http: httpx.Client, base: str, c: Checker, num_spec: int) -> None:
    """Each bad request gets the right status and leaves table and version as they were."""
    view = http.get(TABLE_PATH).json()
    version, table = view["version"], view["table"]
    good = [[1, 256, 1]]
    cases: list[tuple[str, int, dict[str, Any]]] = [
        ("overlap", 422, {"json": {"table": [[1, 10, 1], [5, 256, 2]]}}),
        ("gap at 1", 422, {"json": {"table": [[2, 256, 1]]}}),
        ("k > K", 422, {"json": {"table": [[1, 256, num_spec + 1]]}}),
        ("negative k", 422, {"json": {"table": [[1, 256, -1]]}}),
        ("zero start", 422, {"json": {"table": [[0, 256, 1]]}}),
        ("start after end", 422, {"json": {"table": [[1, 100, 1], [300, 200, 1]]}}),
        ("k as string", 422, {"json": {"table": [[1, 256, "2"]]}}),
        ("k as fraction", 422, {"json": {"table": [[1, 256, 2.5]]}}),
        ("table not a list", 422, {"json": {"table": {"1": 2}}}),
        ("empty table", 422, {"json": {"table": []}}),
        ("unknown field", 422, {"json": {"table": good, "tabel": good}}),
        ("allow_uncaptured not bool", 422, {"json": {"table": good, "allow_uncaptured": "yes"}}),
        (
            "body not JSON",
            400,
            {"content": b"{table: [[1,256,1]]", "headers": {"content-type": "application/json"}},
        ),
        ("body a list", 422, {"json": [[1, 256, 1]]}),
        ("huge body", 413, {"json": {"table": [[1, 256, 1]] * 20000}}),
        (
            "wrong version",
            409,
            {"json": {"table": good}, "headers": {"If-Match": f'"{version + 7}"'}},
        ),
        ("malformed If-Match", 400, {"json": {"table": good}, "headers": {"If-Match": "abc"}}),
    ]
    for name, status, kwargs in cases:
        answer = http.put(TABLE_PATH, **kwargs)
        after = http.get(TABLE_PATH).json()
        c.check(
            f"invalid PUT: {name}",
            answer.status_code == status
            and after["version"] == version
            and after["table"] == table,
            want=status,
            got=answer.status_code,
            detail=answer.text[:160],
        )
    for name, headers in (("no token", {}), ("wrong token", {"Authorization": "Bearer nope"})):
        answer = httpx.put(f"{base}{TABLE_PATH}", json={"table": good}, headers=headers, timeout=30)
        after = http.get(TABLE_PATH).json()
        c.check(
            f"invalid PUT: {name}",
            answer.status_code == 401 and after["version"] == version and after["table"] == table,
            want=401,
            got=answer.status_code,
        )
    answer = http.put(SETTINGS_PATH, json={"exploration_interval": -1})
    after = http.get(TABLE_PATH).json()
    c.check(
        "invalid PUT settings: negative interval",
        answer.status_code == 422 and after["version"] == version,
        got=answer.status_code,
    )


def run_main(args: argparse.Namespace, rates: list[float]) -> dict[str, Any]:
    base, c = args.base, Checker()
    http = admin(base, args.token)
    view = http.get(TABLE_PATH).json()
    num_spec = view["num_speculative_tokens"]
    c.check("GET table", view["dynamic"] and view["table"] == args.start_table, view=view)
    c.check("GET without token is 401", httpx.get(f"{base}{TABLE_PATH}").status_code == 401)
    asyncio.run(load(base, args.model, requests=32, concurrency=32, max_tokens=32))  # warm-up

    per_k = {}
    for k in range(num_spec + 1):
        version = http.get(TABLE_PATH).json()["version"]
        put = http.put(
            TABLE_PATH, json={"table": [[1, 256, k]]}, headers={"If-Match": str(version)}
        )
        c.check(f"PUT k={k}", put.status_code == 200 and put.json()["version"] == version + 1)
        big = k == num_spec
        before = scrape(base)
        stats = asyncio.run(
            load(
                base,
                args.model,
                requests=256 if big else 128,
                concurrency=128 if big else 64,
                max_tokens=512 if big else 256,
            )
        )
        after = scrape(base)
        drafts = delta(after, before, "vllm:spec_decode_num_drafts_total")
        draft_tokens = delta(after, before, "vllm:spec_decode_num_draft_tokens_total")
        ours = [
            delta(
                after,
                before,
                "tabletune_spec_decode_num_draft_tokens_per_pos_total",
                position=str(i),
            )
            for i in range(num_spec)
        ]
        accepted = [
            delta(
                after, before, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)
            )
            for i in range(num_spec)
        ]
        ratio = draft_tokens / drafts if drafts else 0.0
        c.check(
            f"k={k}: vLLM draft_tokens/drafts == k",
            (drafts == 0 and draft_tokens == 0) if k == 0 else (drafts > 0 and ratio == k),
            drafts=drafts,
            draft_tokens=draft_tokens,
        )
        c.check(
            f"k={k}: plugin per-position drafts agree with vLLM totals",
            sum(ours) == draft_tokens
            and (k == 0 or ours[0] == drafts)
            and all(ours[i] == (drafts if i < k else 0) for i in range(num_spec)),
            ours=ours,
        )
        acceptance = [accepted[i] / ours[i] if ours[i] else None for i in range(num_spec)]
        if k:
            c.check(
                f"k={k}: per-position acceptance within 0.02 of the synthetic rates",
                all(abs(acceptance[i] - rates[i]) <= 0.02 for i in range(k)),  # type: ignore[operator]
                measured=acceptance[:k],
                set=rates[:k],
            )
        time.sleep(float(os.environ.get("TABLETUNE_SYNC_INTERVAL_S", "1")) + 1.5)
        steps = delta(scrape(base), before, "tabletune_steps_total", k=str(k))
        c.check(f"k={k}: step cells have k={k} steps", steps > 0, steps=steps)
        gauges = scrape(base)
        c.check(
            f"k={k}: table gauges follow the PUT",
            total(gauges, "tabletune_table_version") == version + 1
            and total(gauges, "tabletune_table_range_k", range_start="1", range_end="256") == k,
        )
        per_k[str(k)] = {
            "drafts": drafts,
            "draft_tokens": draft_tokens,
            "plugin_per_pos": ours,
            "accepted_per_pos": accepted,
            "acceptance": acceptance,
            "load": stats,
        }

    invalid_puts(http, base, c, num_spec)

    # Exploration: table k=1, one step at the longest k every N steps.
    n = args.exploration_interval
    http.put(TABLE_PATH, json={"table": [[1, 256, 1]]}).raise_for_status()
    explore_k = max(http.get(TABLE_PATH).json()["allowed_k"])
    steps_before = http.put(SETTINGS_PATH, json={"exploration_interval": n}).json()[
        "exploration_steps"
    ]
    before = scrape(base)
    asyncio.run(load(base, args.model, requests=128, concurrency=64, max_tokens=512))
    after = scrape(base)
    view = http.get(TABLE_PATH).json()
    time.sleep(float(os.environ.get("TABLETUNE_SYNC_INTERVAL_S", "5")) + 1.5)
    synced = scrape(base)
    drafts = delta(after, before, "vllm:spec_decode_num_drafts_total")
    ours = [
        delta(
            after, before, "tabletune_spec_decode_num_draft_tokens_per_pos_total", position=str(i)
        )
        for i in range(num_spec)
    ]
    rates_above = [ours[i] / ours[0] for i in range(1, explore_k)]
    explored = view["exploration_steps"] - steps_before
    c.check(
        f"exploration N={n}: positions above k=1 drafted at ~1/N of drafts (+-20%)",
        all(abs(r - 1 / n) <= 0.2 / n for r in rates_above),
        rates=rates_above,
        expected=1 / n,
        drafts=drafts,
        per_pos=ours,
    )
    c.check(
        "exploration: steps counted by the engine and exported",
        explored > 0 and total(synced, "tabletune_exploration_steps_total") >= explored,
        engine=explored,
        metric=total(synced, "tabletune_exploration_steps_total"),
    )
    http.put(SETTINGS_PATH, json={"exploration_interval": 0}).raise_for_status()
    http.put(TABLE_PATH, json={"table": args.start_table}).raise_for_status()
    result = {"checks": c.checks, "per_k": per_k, "view": http.get(TABLE_PATH).json()}
    result["throughput"] = run_throughput(args)
    return result


def run_throughput(args: argparse.Namespace) -> list[dict[str, float]]:
    return asyncio.run(
        closed_loop(
            args.base,
            args.model,
            concurrency=args.ab_concurrency,
            max_tokens=1024,
            warmup_s=10,
            windows=args.ab_windows,
            window_s=args.ab_window_s,
        )
    )


def wait_ready(base: str, pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        time.sleep(2)
    return False


def device_info() -> dict[str, Any]:
    info: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds")}
    try:
        import torch
        import vllm

        info["device"] = torch.cuda.get_device_name(0)
        info["vllm_version"] = vllm.__version__
        info["torch_version"] = torch.__version__
    except Exception as error:  # the JSON still records what ran
        info["device_error"] = repr(error)
    return info


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["wait", "main", "throughput"])
    parser.add_argument("--base", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="qwen3-4b")
    parser.add_argument("--token", default=os.environ.get("TABLETUNE_ADMIN_TOKEN"))
    parser.add_argument("--pid", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument(
        "--start-table", type=json.loads, default=[[1, 1, 0], [2, 2, 1], [3, 3, 2], [4, 256, 3]]
    )
    parser.add_argument("--rates", type=json.loads, default=[0.75, 0.55, 0.40])
    parser.add_argument("--exploration-interval", type=int, default=10)
    parser.add_argument("--ab-concurrency", type=int, default=64)
    parser.add_argument("--ab-windows", type=int, default=3)
    parser.add_argument("--ab-window-s", type=float, default=12)
    parser.add_argument("--label", default="A")
    parser.add_argument("--config", type=json.loads, default={})
    parser.add_argument("--out", required=False)
    args = parser.parse_args()
    if args.phase == "wait":
        start = time.monotonic()
        ok = wait_ready(args.base, args.pid, args.timeout)
        print(f"ready={ok} after {time.monotonic() - start:.0f}s", flush=True)
        return 0 if ok else 1
    result: dict[str, Any] = {
        **device_info(),
        "phase": args.phase,
        "label": args.label,
        "config": args.config,
        "start_table": args.start_table,
        "synthetic_rates": args.rates,
    }
    if args.phase == "main":
        result.update(run_main(args, args.rates))
        result["all_ok"] = all(ch["ok"] for ch in result["checks"])
    else:
        http = httpx.get(f"{args.base}{TABLE_PATH}", timeout=10)
        result["admin_route_status"] = http.status_code
        result["throughput"] = run_throughput(args)
    rates_ = [w["tokens_per_s"] for w in result.get("throughput", [])]
    if rates_:
        result["tokens_per_s_mean"] = statistics.fmean(rates_)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    print(
        json.dumps({k: v for k, v in result.items() if k not in ("checks", "per_k")}, default=str)
    )
    return 0 if result.get("all_ok", True) else 2


if __name__ == "__main__":
    sys.exit(main())
