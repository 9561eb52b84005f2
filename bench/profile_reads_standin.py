"""Where the fast profiler's in-flight grid spends its time on the CPU stand-in for vLLM + the
plugin (tests/support/vllm_stand_in.py), bench/gpu/profile_fast.sh's dry run, in three variants
run interleaved (the order rotated every round) and repeated (ROUNDS rounds, two grids each):

  before   the profiler of BEFORE (main when branch switchread started), reading the step cells
           through the step-cells route, then setting the next window's k (a second call)
  after    this checkout's profiler, through the route: the read that finds a window full sets
           the next window's k in the same engine call (a conditional table PUT)
  metrics  this checkout's profiler on a stand-in without the route (STAND_IN_OLD_PLUGIN=1:
           an older plugin; the profiler reads /metrics, as of the plugin's last sync)

Same stand-in, same driver, same grid; only the source differs between before and after
(BEFORE's src/ from git, first on PYTHONPATH: its profiler, and its plugin in the stand-in).

A stand-in on a shared CPU: its steps are asyncio sleeps of a few ms on the event loop that
also serves the reads, and it answers a read or a k switch at once, not between two steps as
vLLM does (so the old-k step a read-then-switch loses on vLLM is not modelled here: the fake
engine of tests/unit/test_profiler_inflight.py shows that one); the numbers show where the
wait went (reads, window ends, idle waits, the switch's own call), not what an H200 takes.
Writes bench/results/profile_fast_reads_standin.json.

    .venv/bin/python bench/profile_reads_standin.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from tests.support.gpu_jobs import dry_run  # noqa: E402
from tests.support.vllm_stand_in import OLD_PLUGIN_ENV  # noqa: E402

from bench.common import environment, write_result  # noqa: E402

DRIVER_ARGS = (  # as tests/integration/test_profile_fast_dry_run.py
    "--max-num-seqs 8 --dense-until 4 --grid-step 4 --cross-check 1,8 "
    "--acceptance-prompts 32 --acceptance-tokens 64"
)
BEFORE = "d2d7389"  # main when branch switchread started
VARIANTS = ("before", "after", "metrics")
RUNS = ("run1", "run2")


def grid_breakdown(out: Path, run: str) -> dict[str, Any]:
    """One in-flight grid's wall time by phase, its reads and its windows."""
    summary = json.loads((out / "profile_fast.json").read_text())["runs"][run]
    windows = json.loads((out / run / "profile.raw.json").read_text())["windows"]
    wall = summary["wall_time_s"]
    events = summary["in_flight_events"]
    count = len(windows)
    own_s = sum(w["seconds"] for w in windows)
    return {
        "timing_s": wall["timing"],
        "phases_s": {name: wall[f"timing.{name}"] for name in ("stop", "settle", "k_switch")}
        | {"fill": wall["timing.fill"], "read (inside the others)": wall["timing.read"]},
        "events": events,
        "windows": count,
        "reads_per_window": events["reads"] / count,
        "ms_per_read": 1000 * wall["timing.read"] / events["reads"],
        "fill_ms_per_window": 1000 * wall["timing.fill"] / count,
        "own_steps_ms_per_window": 1000 * own_s / count,
        "steps_per_window": dict(sorted(Counter(int(w["steps"]) for w in windows).items())),
        "uncounted_steps_per_window": dict(
            sorted(Counter(int(w["engine_steps"] - w["steps"]) for w in windows).items())
        ),
        "median_steps_per_window": statistics.median(w["steps"] for w in windows),
    }


def source_of(commit: str, folder: Path) -> Path:
    """``commit``'s src/ under ``folder`` (from git: the worktree stays as it is)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "src"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder / "src"


def one_launch(variant: str, before_src: Path) -> dict[str, Any]:
    src = before_src if variant == "before" else ROOT / "src"
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        done = dry_run(
            "profile_fast.sh",
            out,
            BUDGET_S="200",
            DRIVER_ARGS=DRIVER_ARGS,
            WARM_START="1",
            WARM_NEEDS_S="60",
            PYTHONPATH=f"{src}:{ROOT}",
            **{OLD_PLUGIN_ENV: "1" if variant == "metrics" else "0"},
        )
        if done.returncode != 0:
            raise SystemExit(f"{variant}: the dry run failed:\n{done.stdout[-3000:]}")
        return {run: grid_breakdown(out, run) for run in RUNS}


def medians(launches: list[dict[str, Any]]) -> dict[str, float]:
    grids = [launch[run] for launch in launches for run in RUNS]
    return {
        "timing_s": statistics.median(g["timing_s"] for g in grids),
        "reads_per_window": statistics.median(g["reads_per_window"] for g in grids),
        "fill_ms_per_window": statistics.median(g["fill_ms_per_window"] for g in grids),
        "settle_s": statistics.median(g["phases_s"]["settle"] for g in grids),
        "k_switches": statistics.median(g["events"]["k_switches"] for g in grids),
        "read_switches": statistics.median(g["events"].get("read_switches", 0) for g in grids),
        "k_switch_s": statistics.median(g["phases_s"]["k_switch"] for g in grids),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    launches: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    order: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        before_src = source_of(BEFORE, Path(folder))
        for round_ in range(args.rounds):
            for i in range(len(VARIANTS)):
                variant = VARIANTS[(round_ + i) % len(VARIANTS)]
                order.append(variant)
                launches[variant].append(one_launch(variant, before_src))
    summary = {v: medians(runs) for v, runs in launches.items()}
    payload = {
        "what": "fast profiler, in-flight grid on the CPU stand-in for vLLM + the plugin "
        f"(bench/profile_reads_standin.py): the profiler of {BEFORE} (before: a read, then a "
        "k switch) vs this branch's (after: the read that finds a window full sets the next "
        "k in the same call), both reading step cells through the step-cells route, and this "
        "branch's through /metrics (an older plugin); interleaved, each launch two grids. "
        "A STAND-IN, NOT A GPU MEASUREMENT: its steps are asyncio sleeps of 2-11 ms on the "
        "event loop that also answers the reads, and reads and k switches are answered at "
        "once, not between two steps",
        "command": f".venv/bin/python bench/profile_reads_standin.py --rounds {args.rounds}",
        **environment(engine_version="stand-in (tests/support/vllm_stand_in.py)"),
        "grid": "B in 1,2,3,4,8 x k in 0..3, 3 windows per cell, window_steps 8 ("
        + DRIVER_ARGS
        + ")",
        "before_commit": BEFORE,
        "launch_order": order,
        "median_over_grids": summary,
        "after_over_before_timing": summary["after"]["timing_s"] / summary["before"]["timing_s"],
        "launches": launches,
    }
    print(json.dumps(summary, indent=1))
    print(write_result("profile_fast_reads_standin", payload))


if __name__ == "__main__":
    main()
