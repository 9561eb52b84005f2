"""The fast profiler on real vLLM 0.26 (+ the TableTune plugin and profiler hook), in ONE launch
(profile_fast.sh): the driver attaches to the server the script started.

Parts, in this order (each recorded whole or as an error; the JSON rewritten after each):

  run1   ``tabletune profile`` in-flight over the whole grid (dense to 16, then every 8), every
         k, REPEATS windows per cell; then the request method on the cross-check batch sizes at
         every k (same launch: do both agree on pure decode?), left out when less time is left
         than --grid-estimate-s and the cross-check's ~40 s; then acceptance under the
         synthetic rates (test mode)
  run2   the in-flight grid again (no cross-check, no acceptance): do two profiles in a row give
         the same table?

With WARM_START=1 the script launched vLLM once before (to fill its compile cache) and passes
that cold start's time (--cold-start-s) and what it cost (--before-s, counted in the job's wall
time); the start timed here is then the warm one.

Each run's files (profile, summary, raw windows, table, PNGs) go under OUT/<run>/. Both tables
are built here the same way, from each run's profile and run1's acceptance. A part that no
longer fits the budget is skipped. profile_fast_report.py turns the JSON into
bench/results/profile_fast_h200.json (and the PNG).

    python3 bench/gpu/profile_fast.py --base URL --pid VLLM_PID --budget-s 380 --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from profile_fast_report import summarize  # this script's folder is first on sys.path

from tabletune.profiler.cudagraphs import capture_config_from_log, capture_cost_from_log
from tabletune.profiler.run import ProfileRequest, ProfileRun
from tabletune.profiler.settings import (
    AcceptanceSettings,
    GridSettings,
    InFlightSettings,
    ProfilerSettings,
    TimingSettings,
)
from tabletune.schemas import load_profile
from tabletune.schemas.profile import step_times_of
from tabletune.solver import build_table

Row = dict[str, Any]
CROSS_CHECK_S = 40  # the request method on 8 batch sizes x 4 k took 32 s on the H200


class LineReporter:
    """Progress as plain lines (the run log is a file): phases, notes, and each phase's time."""

    def __init__(self) -> None:
        self._phase: tuple[str, int, float] | None = None
        self._count = 0

    def phase(self, name: str, total: int) -> None:
        self.done()
        self._phase, self._count = (name, total, time.monotonic()), 0
        print(f"-- {name}: {total} steps", flush=True)

    def advance(self, detail: str = "") -> None:
        self._count += 1
        if self._phase and self._count % 48 == 0:
            print(f"   {self._count}/{self._phase[1]} {detail}", flush=True)

    def done(self) -> None:
        if self._phase is not None:
            name, _, started = self._phase
            print(f"-- {name} done in {time.monotonic() - started:.1f} s", flush=True)
        self._phase = None

    def note(self, message: str) -> None:
        print(message, flush=True)


def wait_ready(base: str, pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if pid and not Path(f"/proc/{pid}").exists():
            return False
        time.sleep(1)
    return False


class Job:
    def __init__(self, args: argparse.Namespace, result: Row) -> None:
        self.args = args
        self.result = result
        self.deadline = time.monotonic() + args.budget_s
        self.folder = Path(args.out).parent

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        try:
            self.result["summary"] = summarize(self.result)
        except Exception as error:  # the raw parts are what counts; the report can redo this
            self.result["summary"] = {"error": repr(error)[:500]}
        Path(self.args.out).write_text(json.dumps(self.result, indent=1) + "\n")

    def part(self, name: str, needs_s: float, body: Any) -> None:
        if self.left_s() < needs_s:
            self.result["skipped"].append(
                {"part": name, "needed_s": round(needs_s), "left_s": round(self.left_s())}
            )
            print(f"== {name} skipped ({self.left_s():.0f} s left, needs {needs_s:.0f})")
            return
        started = time.monotonic()
        print(f"== {name} ({self.left_s():.0f} s left)", flush=True)
        try:
            body()
        except KeyboardInterrupt:  # the script's time limit: keep what was measured, then stop
            self.result["errors"].append({"part": name, "error": "interrupted (time limit)"})
            self.result["durations_s"][name] = round(time.monotonic() - started, 1)
            self.save()
            raise
        except Exception as error:  # a failed part is recorded; the next part still runs
            self.result["errors"].append({"part": name, "error": repr(error)[:800]})
            traceback.print_exc()
        self.result["durations_s"][name] = round(time.monotonic() - started, 1)
        self.save()

    def settings(self, *, cross_check: tuple[int, ...], acceptance: bool) -> ProfilerSettings:
        a = self.args
        grid = (
            GridSettings(explicit=a.batch_sizes)
            if a.batch_sizes
            else GridSettings(dense_until=a.dense_until, step=a.grid_step)
        )
        return ProfilerSettings(
            grid=grid,
            timing=TimingSettings(repeats=a.repeats, decode_tokens=a.decode_tokens),
            in_flight=InFlightSettings(
                window_steps=a.window_steps,
                max_context=a.max_context,
                sync_interval_s=a.sync_interval_s,
                cross_check=cross_check,
            ),
            acceptance=AcceptanceSettings(
                synthetic_rates=a.rates,
                num_prompts=a.acceptance_prompts,
                max_tokens=a.acceptance_tokens,
                enabled=acceptance,
            ),
        )

    def profile(self, name: str, settings: ProfilerSettings) -> None:
        a = self.args
        request = ProfileRequest(
            output=self.folder / name / "profile.json",
            model=a.model_path,
            drafter=a.drafter_path,
            num_speculative_tokens=a.num_speculative_tokens,
            max_num_seqs=a.max_num_seqs,
            attach_url=a.base,
            ks=a.ks,
            model_runner="v2",
            engine_log=a.vllm_log,
            notes=f"bench/gpu/profile_fast.py {name}",
        )
        run = ProfileRun(request, settings=settings, reporter=LineReporter())
        outcome = run.run()
        summary = json.loads(outcome.paths.summary.read_text())
        self.result["runs"][name] = summary
        self.result["profiles"][name] = str(outcome.paths.profile)
        if outcome.acceptance is not None:
            self.result["rates"] = list(outcome.acceptance.rates)

    def tables(self) -> None:
        """Both runs' tables, built the same way (run1's acceptance, or the rates set)."""
        rates = self.result.get("rates") or list(self.args.rates)
        for name, path in self.result["profiles"].items():
            profile = load_profile(path)
            solution = build_table(step_times_of(profile), rates, allowed_k=profile.ks)
            self.result["tables"][name] = [list(r) for r in solution.ranges]


def engine_facts(log: Path | None, memory: Path | None) -> Row:
    """What the server's log says about its CUDA graphs (capture sizes, capture time, graph
    memory), and the GPU memory in use once it answered (the script's nvidia-smi reading)."""
    text = log.read_text(errors="replace") if log is not None and log.exists() else ""
    config, cost = capture_config_from_log(text), capture_cost_from_log(text)
    used = memory.read_text().strip() if memory is not None and memory.exists() else ""
    return {
        "max_capture_size": None if config is None else config.max_capture_size,
        "capture_s": None if cost is None else cost.seconds,
        "capture_gib": None if cost is None else cost.gib,
        "gpu_memory_used_mib": int(used) if used.isdigit() else None,
    }


def run(args: argparse.Namespace) -> int:
    result: Row = {
        "meta": {
            "what": "fast profiler: in-flight grid, request-method cross-check, a second grid",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            **json.loads(args.meta),
            "grid": {
                "dense_until": args.dense_until,
                "step": args.grid_step,
                "explicit": list(args.batch_sizes or ()),
            },
            "repeats": args.repeats,
            "window_steps": args.window_steps,
            "max_context": args.max_context,
            "cross_check": list(args.cross_check),
            "rates": list(args.rates),
        },
        "runs": {},
        "profiles": {},
        "tables": {},
        "errors": [],
        "skipped": [],
        "durations_s": {},
    }
    job = Job(args, result)
    started = time.monotonic()
    ready = wait_ready(args.base, args.pid, min(args.ready_timeout_s, job.left_s()))
    result["meta"]["startup_s"] = round(time.monotonic() - started + args.started_s, 1)
    result["meta"]["warm_start"] = args.before_s > 0
    result["meta"]["cold_start_s"] = args.cold_start_s
    result["meta"]["before_s"] = args.before_s
    result["meta"]["engine"] = engine_facts(args.vllm_log, args.memory_file)
    if not ready:
        result["errors"].append({"part": "start", "error": "vLLM did not become ready"})
        job.save()
        return 1
    cross = args.cross_check if args.cross else ()
    if cross and job.left_s() < args.grid_estimate_s + CROSS_CHECK_S:
        result["skipped"].append(
            {
                "part": "cross_check",
                "needed_s": round(args.grid_estimate_s + CROSS_CHECK_S),
                "left_s": round(job.left_s()),
            }
        )
        print(f"== cross-check skipped ({job.left_s():.0f} s left): the grid alone")
        cross = ()
    first = job.settings(cross_check=cross, acceptance=args.acceptance)
    job.part("run1", 60, lambda: job.profile("run1", first))
    if args.runs > 1:
        timing = (result["runs"].get("run1") or {}).get("wall_time_s", {}).get("timing", 150)
        again = replace(first, in_flight=replace(first.in_flight, cross_check=()))
        again = replace(again, acceptance=replace(again.acceptance, enabled=False))
        # The same grid again: run 1's timing and a little (1.15x + 10 s skipped it by 2 s
        # at 23:45 on 2026-11-30); past the deadline it is interrupted and run 1 still stands.
        job.part("run2", 1.05 * timing + 5, lambda: job.profile("run2", again))
    job.part("tables", 0, job.tables)
    result["meta"]["engine"] = engine_facts(args.vllm_log, args.memory_file)  # memory read by now
    result["meta"]["wall_s"] = round(time.monotonic() - started + args.started_s + args.before_s, 1)
    job.save()
    print(f"wrote {args.out}", flush=True)
    return 0 if not result["errors"] else 2


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="http://127.0.0.1:8000")
    parser.add_argument("--pid", type=int, default=0, help="vLLM's pid (stop waiting if it dies)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--meta", default="{}", help="JSON merged into the meta block")
    parser.add_argument("--budget-s", type=float, default=400, help="this script's whole run")
    parser.add_argument("--started-s", type=float, default=0, help="launch to this script's start")
    parser.add_argument(
        "--cold-start-s",
        type=lambda t: None if t == "null" else float(t),
        help="warm start: the first (cold) launch's time to /health ('null': it never answered)",
    )
    parser.add_argument(
        "--before-s", type=float, default=0, help="warm start: the cold launch and its stop"
    )
    parser.add_argument(
        "--grid-estimate-s",
        type=float,
        default=130,
        help="the grid's expected time: less left than it and the cross-check, no cross-check",
    )
    parser.add_argument("--ready-timeout-s", type=float, default=300)
    parser.add_argument("--vllm-log", type=Path, help="the server's log (capture sizes, cost)")
    parser.add_argument("--memory-file", type=Path, help="GPU memory used after start, MiB")
    parser.add_argument("--model-path", default="/tmp/models/qwen3-4b")
    parser.add_argument("--drafter-path", default="/tmp/models/qwen3-4b-eagle3")
    parser.add_argument("--num-speculative-tokens", "-K", type=int, default=3)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--ks", type=_ints, help="profiled k (default 0..K)")
    parser.add_argument("--dense-until", type=int, default=16)
    parser.add_argument("--grid-step", type=int, default=8)
    parser.add_argument("--batch-sizes", type=_ints, help="an explicit grid instead")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window-steps", type=int, default=8)
    parser.add_argument("--max-context", type=int, default=256, help="in-flight context cap")
    parser.add_argument(
        "--decode-tokens", type=int, default=16, help="request method (cross-check)"
    )
    parser.add_argument("--sync-interval-s", type=float, default=0.05, help="the server's")
    parser.add_argument(
        "--cross-check",
        type=_ints,
        default=(1, 4, 8, 16, 32, 64, 128, 256),
        help="batch sizes also timed by the request method ('' for none)",
    )
    parser.add_argument(
        "--rates",
        type=lambda t: tuple(float(v) for v in t.split(",")),
        default=(0.75, 0.55, 0.40),
        help="synthetic acceptance (test mode)",
    )
    parser.add_argument("--acceptance-prompts", type=int, default=160)
    parser.add_argument("--acceptance-tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=2, choices=(1, 2))
    parser.add_argument("--no-acceptance", dest="acceptance", action="store_false")
    parser.add_argument("--no-cross-check", dest="cross", action="store_false")
    args = parser.parse_args()
    try:
        return run(args)
    except KeyboardInterrupt:  # the script's time limit: what was measured is already saved
        print("interrupted", flush=True)
        return 3


if __name__ == "__main__":
    raise SystemExit(main())
