"""Live step time on real vLLM 0.26 (+ the TableTune plugin), in ONE launch (live_step_time.sh).

Closed-loop traffic of CLIENTS clients, lengths drawn from a named shape (traffic.py; default
decode-heavy: prompts 16-96 tokens, outputs 300-700, drawn at random; each client's first request
starts part-way through, so contexts are spread from the start). Parts, in this order (a later
part never disturbs what an earlier one measured):

  fixed-k     arms fixed k=2 / k=3 (PUT [[1,256,k]]), ABBA-rotated, ROUNDS x 2 windows: tokens/s
              from vllm:generation_tokens_total and the plugin's step cells over each window
  neighbour   table k=3 with neighbour exploration every NEIGHBOUR_INTERVAL steps: k=2 steps in
              the cells
  counters    traffic drained, engine idle, one sync later: plugin totals vs vLLM's counters
  overhead    settings step_timing false vs true (policy installed: exploration 50, hysteresis
              4; the table k=3 so neither changes k), ABBA-rotated windows, fresh clients

Every window is one raw row (vLLM counter increases, step-cell increases in the wire form of
tabletune.step_cells, the view at its end). The JSON is rewritten after every part, so a run cut
short keeps what it measured; a part that fails is recorded in "errors" and the next one runs.
bench/gpu/live_step_time_report.py turns the JSON into bench/results/live_step_time_h200.json.

    python3 bench/gpu/live_step_time.py --pid VLLM_PID --budget-s 380 --out OUT.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from live_step_time_report import summarize  # this script's folder is first on sys.path
from prometheus_client.parser import text_string_to_metric_families
from traffic import SHAPES, ClosedLoop, Row, TrafficShape, add_traffic_arguments, checked_shape

from tabletune import metric_names as names
from tabletune.profiler.step_reading import CELL_SAMPLES, SWITCH_STEPS, WITHOUT_DECODE
from tabletune.step_cells import CellKey, CellTotals, cells_to_wire, parse_cell_label

TABLE_PATH = "/tabletune/v1/table"
SETTINGS_PATH = "/tabletune/v1/settings"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# vLLM's counters each window records (increases), by sample name.
VLLM_COUNTERS = (
    f"{names.VLLM_GENERATION_TOKENS}_total",
    "vllm:prompt_tokens_total",
    f"{names.VLLM_NUM_DRAFTS}_total",
    f"{names.VLLM_NUM_DRAFT_TOKENS}_total",
    f"{names.VLLM_NUM_ACCEPTED_TOKENS}_total",
    "vllm:iteration_tokens_total_count",
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
)
RUNNING = names.VLLM_NUM_REQUESTS_RUNNING
SWITCH_SECONDS = f"{names.TT_SWITCH_SECONDS}_total"
WAITING = "vllm:num_requests_waiting"
STATIC = {"exploration_interval": 0, "hysteresis": 0, "neighbour_interval": 0}
TIMING_ON = {"step_timing": True, "exploration_interval": 50, "hysteresis": 4,
             "neighbour_interval": 0}  # fmt: skip
TIMING_OFF = {"step_timing": False}


# -- pure parts (unit-tested) -------------------------------------------------------------------


def parse_samples(text: str) -> Samples:
    """Every sample of a /metrics text, keyed by (sample name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: Samples, name: str) -> float:
    """Sum of one sample name over all its label sets (one engine here)."""
    return sum(value for (sample, _), value in samples.items() if sample == name)


def cells_from_samples(samples: Samples) -> tuple[dict[CellKey, CellTotals], float]:
    """The plugin's exported step cells (totals) and steps without decode."""
    sums: dict[CellKey, list[float]] = {}
    for (name, labels), value in samples.items():
        if name in CELL_SAMPLES:
            label = dict(labels)
            key = (int(label[names.LABEL_K]), *parse_cell_label(label[names.LABEL_BATCH]))
            sums.setdefault(key, [0.0] * 5)[CELL_SAMPLES.index(name)] += value
    return {key: CellTotals(*row) for key, row in sums.items()}, total(samples, WITHOUT_DECODE)


def cells_increase(after: Samples, before: Samples) -> dict[str, Any]:
    """The step cells' increase between two scrapes, in tabletune.step_cells' wire form, with
    the steps at a new k the plugin counts apart (where a burst's hidden cost may land: the
    bursts read a k 0.71-1.53x its running time, bench/results/burst_vs_run_h200.json)."""
    cells_after, without_after = cells_from_samples(after)
    cells_before, without_before = cells_from_samples(before)
    increase = {
        key: totals.since(cells_before.get(key, CellTotals()))
        for key, totals in cells_after.items()
    }
    used = {key: totals for key, totals in increase.items() if totals.steps > 0}
    switches = (
        total(after, SWITCH_STEPS) - total(before, SWITCH_STEPS),
        total(after, SWITCH_SECONDS) - total(before, SWITCH_SECONDS),
    )
    return cells_to_wire(used, without_after - without_before, switches=switches)


def window_row(
    label: Mapping[str, Any],
    before: Samples,
    after: Samples,
    wall_s: float,
    running: list[float],
    view: Mapping[str, Any] | None,
) -> Row:
    """One measurement window: vLLM's counter increases, the cells' increase, the view."""
    vllm = {name: total(after, name) - total(before, name) for name in VLLM_COUNTERS}
    return {
        **label,
        "wall_s": wall_s,
        "tokens_per_s": vllm[VLLM_COUNTERS[0]] / wall_s,
        "mean_running": statistics.fmean(running) if running else None,
        "vllm": vllm,
        "cells": cells_increase(after, before),
        "view": view,
    }


def utc_stamp() -> str:
    """Now, UTC, ISO 8601 with milliseconds (what window rows record)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def counters_snapshot(samples: Samples, *, requests_sent: int) -> Row:
    """Whole-run totals of the plugin and of vLLM (taken idle, after the last sync)."""
    cells, without = cells_from_samples(samples)
    drafting = [(k, t) for (k, _, _), t in cells.items() if k > 0]
    return {
        "plugin_steps": sum(t.steps for t in cells.values()),
        "plugin_steps_without_decode": without,
        "plugin_requests_in_k_steps": sum(t.requests for _, t in drafting),
        "plugin_draft_slots": sum(k * t.requests for k, t in drafting),
        "vllm": {name: total(samples, name) for name in VLLM_COUNTERS},
        "requests_sent": requests_sent,
    }


def abba(arms: tuple[str, str], rounds: int) -> list[str]:
    """A B B A A B ...: each arm as often as the other, first and second place alternating,
    so a linear drift in the machine does not favour either."""
    first, second = arms
    return [arm for r in range(rounds) for arm in ((first, second) if r % 2 == 0 else arms[::-1])]


# -- talking to the server ----------------------------------------------------------------------


class Server:
    def __init__(self, base: str) -> None:
        self._http = httpx.AsyncClient(base_url=base, timeout=30)

    async def scrape(self) -> Samples:
        return parse_samples((await self._http.get("/metrics")).text)

    async def view(self) -> Row:
        response = await self._http.get(TABLE_PATH)
        response.raise_for_status()
        return dict(response.json())

    async def put(self, path: str, body: Row) -> Row:
        response = await self._http.put(path, json=body)
        if response.status_code != 200:
            raise RuntimeError(f"PUT {path} {body} -> {response.status_code} {response.text}")
        return dict(response.json())

    async def window(self, label: Row, seconds: float) -> Row:
        """One window of ``seconds``; it records when it started and ended (UTC, ms), so
        outside logs (the GPU's clocks) can be aligned with it."""
        before, start, started = await self.scrape(), time.monotonic(), utc_stamp()
        running = []
        while (left := start + seconds - time.monotonic()) > 0:
            await asyncio.sleep(min(2.0, left))
            running.append(total(await self.scrape(), RUNNING))
        after, wall, ended = await self.scrape(), time.monotonic() - start, utc_stamp()
        span = {**label, "started_utc": started, "ended_utc": ended}
        return window_row(span, before, after, wall, running, await self.view())

    async def wait_idle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            samples = await self.scrape()
            if total(samples, RUNNING) == 0 and total(samples, WAITING) == 0:
                return True
            await asyncio.sleep(0.5)
        return False


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """What every driver of this launcher takes: where vLLM is, where results go, the budget."""
    parser.add_argument("--base", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="qwen3-4b")
    parser.add_argument("--pid", type=int, default=0, help="vLLM's pid (stop waiting if it dies)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--meta", default="{}", help="JSON merged into the meta block")
    parser.add_argument("--budget-s", type=float, default=380, help="this script's whole run")
    parser.add_argument("--started-s", type=float, default=0, help="launch to this script's start")
    parser.add_argument("--ready-timeout-s", type=float, default=300)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--sync-interval-s", type=float, default=1.0)


def empty_result(meta: Row) -> Row:
    """A driver's JSON before its first part."""
    return {"meta": meta, "windows": [], "errors": [], "skipped": [], "durations_s": {}}


async def wait_started(live: Run) -> bool:
    """vLLM answering within the budget: its start-up recorded in meta; an error if not."""
    args, started = live.args, time.monotonic()
    ready = await wait_ready(args.base, args.pid, min(args.ready_timeout_s, live.left_s()))
    live.result["meta"]["startup_s"] = round(time.monotonic() - started + args.started_s, 1)
    if not ready:
        live.result["errors"].append({"part": "start", "error": "vLLM did not become ready"})
        live.save()
    return ready


async def wait_ready(base: str, pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=base, timeout=2) as http:
        while time.monotonic() < deadline:
            try:
                if (await http.get("/health")).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            if pid and not Path(f"/proc/{pid}").exists():
                return False
            await asyncio.sleep(2)
    return False


# -- the run ------------------------------------------------------------------------------------


class Run:
    """The parts, each recorded whole or as an error; the JSON rewritten after each."""

    def __init__(self, args: argparse.Namespace, result: Row) -> None:
        self.args = args
        self.result = result
        self.server = Server(args.base)
        self.deadline = time.monotonic() + args.budget_s
        self.shape = SHAPES[args.shape]

    def closed_loop(
        self, seed: int, shape: TrafficShape | None = None, clients: int | None = None
    ) -> ClosedLoop:
        """The job's clients (or ``clients``), sending requests of ``shape`` (default: the
        job's)."""
        args = self.args
        return ClosedLoop(args.base, args.model, clients or args.clients, seed,
                          shape or self.shape, max_model_len=args.max_model_len)  # fmt: skip

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        try:
            self.result["summary"] = summarize(self.result)
        except Exception as error:  # the raw rows are what counts; the report can redo this
            self.result["summary"] = {"error": repr(error)[:500]}
        Path(self.args.out).write_text(json.dumps(self.result, indent=1) + "\n")

    async def part(self, name: str, needs_s: float, body: Callable[[], Awaitable[None]]) -> None:
        if self.left_s() < needs_s:
            self.result["skipped"].append({"part": name, "needed_s": needs_s,
                                           "left_s": round(self.left_s(), 1)})  # fmt: skip
            return
        started = time.monotonic()
        print(f"== {name} ({self.left_s():.0f} s left)", flush=True)
        try:
            await body()
        except Exception as error:  # a failed part is recorded; the next part still runs
            self.result["errors"].append({"part": name, "error": repr(error)[:500]})
            print(f"!! {name}: {error!r}", flush=True)
        self.result["durations_s"][name] = round(time.monotonic() - started, 1)
        self.save()

    async def windows(self, part: str, arms: list[str], apply: Callable[[str], Awaitable[None]],
                      seconds: float) -> None:  # fmt: skip
        for index, arm in enumerate(arms):
            await apply(arm)
            await asyncio.sleep(self.args.settle_s)  # past the switch and one sync round
            await self.window(part, arm, index, seconds)

    async def window(self, part: str, arm: str, index: int, seconds: float, **label: int) -> Row:
        """One window, recorded with its part, arm, place and ``label``'s further places."""
        row = await self.server.window({"part": part, "arm": arm, "index": index, **label},
                                       seconds)  # fmt: skip
        self.result["windows"].append(row)
        print(json.dumps({k: row[k] for k in ("part", "arm", "tokens_per_s")}), flush=True)
        return row

    def fixed_table(self, k: int) -> list[list[int]]:
        """One range: k at every batch size the engine runs."""
        return [[1, self.args.max_num_seqs, k]]

    async def put_fixed_k(self, k: int) -> None:
        await self.server.put(TABLE_PATH, {"table": self.fixed_table(k)})

    def finish(self) -> int:
        """The JSON written a last time; the exit code: 2 when a part failed."""
        self.save()
        print(f"wrote {self.args.out}", flush=True)
        return 0 if not self.result["errors"] else 2

    async def fixed_k(self) -> None:
        await self.server.put(SETTINGS_PATH, STATIC)

        async def apply(arm: str) -> None:
            await self.put_fixed_k(int(arm.removeprefix("k")))

        arms = abba(("k2", "k3"), self.args.rounds)
        await self.windows("fixed-k", arms, apply, self.args.window_s)

    async def neighbour(self) -> None:
        await self.put_fixed_k(3)

        async def apply(arm: str) -> None:
            await self.server.put(SETTINGS_PATH, {**STATIC, "neighbour_interval": int(arm[1:])})

        await self.windows("neighbour", [f"n{self.args.neighbour_interval}"], apply,
                           self.args.neighbour_window_s)  # fmt: skip
        await self.server.put(SETTINGS_PATH, STATIC)

    async def counters(self, load: ClosedLoop) -> None:
        await load.drain()
        idle = await self.server.wait_idle(60)
        await asyncio.sleep(self.args.sync_interval_s + 1.5)  # the plugin's last sync after idle
        snapshot = counters_snapshot(await self.server.scrape(), requests_sent=load.sent)
        self.result["counters"] = {**snapshot, "idle": idle, "failed_requests": load.failed}

    async def overhead(self) -> None:
        await self.put_fixed_k(3)
        await asyncio.sleep(self.args.warmup_s / 2)  # fresh clients: contexts spread again
        # Fit the windows into the time left (at least 3 per arm), keeping 15 s for the end.
        per_window = self.args.window_s + self.args.settle_s + 1.5
        fits = int((self.left_s() - 15) // (2 * per_window))
        rounds = max(3, min(self.args.overhead_rounds, fits))

        async def apply(arm: str) -> None:
            await self.server.put(SETTINGS_PATH, TIMING_ON if arm == "on" else TIMING_OFF)

        arms = abba(("on", "off"), rounds)
        await self.windows("overhead", arms, apply, self.args.window_s)
        await self.server.put(SETTINGS_PATH, {**STATIC, "step_timing": True})


async def run(args: argparse.Namespace) -> int:
    result = empty_result(
        {
            "what": "live step time: fixed k=2/3 throughput vs the plugin's step cells, counters "
            "vs vLLM, step-timing overhead A/B, neighbour exploration",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            **json.loads(args.meta),
            "clients": args.clients,
            "lengths": SHAPES[args.shape].describe(),
            "window_s": args.window_s,
            "settle_s": args.settle_s,
            "neighbour_interval": args.neighbour_interval,
            "timing_on_settings": TIMING_ON,
        }
    )
    live = Run(args, result)  # the budget counts from here
    if not await wait_started(live):
        return 1
    result["meta"]["start_view"] = await live.server.view()
    window_part_s = args.window_s + args.settle_s + 1.5
    load = live.closed_loop(seed=1)
    await live.part("warmup", args.warmup_s, lambda: asyncio.sleep(args.warmup_s))
    await live.part("fixed-k", 2 * args.rounds * window_part_s, live.fixed_k)
    await live.part("neighbour", args.neighbour_window_s + args.settle_s + 3, live.neighbour)
    await live.part("counters", 30, lambda: live.counters(load))
    await load.drain()  # (already drained unless the counters part was skipped)
    load = live.closed_loop(seed=2)
    await live.part("overhead", 6 * window_part_s + args.warmup_s / 2, live.overhead)
    await load.drain()
    return live.finish()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_job_arguments(parser)
    parser.add_argument("--clients", type=int, default=128)
    parser.add_argument("--warmup-s", type=float, default=20)
    parser.add_argument("--window-s", type=float, default=10)
    parser.add_argument("--settle-s", type=float, default=2.5)
    parser.add_argument("--rounds", type=int, default=4, help="fixed-k: windows per arm")
    parser.add_argument("--overhead-rounds", type=int, default=5, help="windows per arm")
    parser.add_argument("--neighbour-interval", type=int, default=16)
    parser.add_argument("--neighbour-window-s", type=float, default=15)
    add_traffic_arguments(parser)
    args = parser.parse_args()
    checked_shape(parser, args)
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
