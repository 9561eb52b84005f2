"""Where the fast profiler's in-flight grid spends its time when it reads the step cells through
the admin API's step-cells route (as of the engine's last step) versus through /metrics (as of
the plugin's last sync, an older plugin), on the CPU stand-in for vLLM + the plugin
(tests/support/vllm_stand_in.py): bench/gpu/profile_fast.sh's dry run, twice, same code, the
stand-in without the route the second time (STAND_IN_OLD_PLUGIN=1).

A stand-in on a shared CPU: its steps are asyncio sleeps of a few ms on the event loop that
also serves the reads, so the numbers show where the wait went (reads, window ends, idle
waits), not what an H200 takes. Writes bench/results/profile_fast_reads_standin.json.

    .venv/bin/python bench/profile_reads_standin.py
"""

from __future__ import annotations

import json
import statistics
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
VARIANTS = {"route": "0", "metrics": "1"}  # the value of STAND_IN_OLD_PLUGIN


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
        "median_steps_per_window": statistics.median(w["steps"] for w in windows),
    }


def main() -> None:
    results: dict[str, Any] = {}
    for name, old_plugin in VARIANTS.items():
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder)
            done = dry_run(
                "profile_fast.sh",
                out,
                BUDGET_S="200",
                DRIVER_ARGS=DRIVER_ARGS,
                WARM_START="1",
                WARM_NEEDS_S="60",
                **{OLD_PLUGIN_ENV: old_plugin},
            )
            if done.returncode != 0:
                raise SystemExit(f"{name}: the dry run failed:\n{done.stdout[-3000:]}")
            results[name] = {run: grid_breakdown(out, run) for run in ("run1", "run2")}
    route, metrics = results["route"], results["metrics"]
    payload = {
        "what": "fast profiler, in-flight grid: step cells read through the step-cells route vs "
        "/metrics, on the CPU stand-in for vLLM + the plugin (bench/profile_reads_standin.py). "
        "A STAND-IN, NOT A GPU MEASUREMENT: its steps are asyncio sleeps of 2-11 ms on the "
        "event loop that also answers the reads",
        "command": ".venv/bin/python bench/profile_reads_standin.py",
        **environment(engine_version="stand-in (tests/support/vllm_stand_in.py)"),
        "grid": "B in 1,2,3,4,8 x k in 0..3, 3 windows per cell, window_steps 8 ("
        + DRIVER_ARGS
        + ")",
        "route": route,
        "metrics": metrics,
        "timing_ratio_route_over_metrics": {
            run: route[run]["timing_s"] / metrics[run]["timing_s"] for run in ("run1", "run2")
        },
    }
    print(json.dumps(payload["timing_ratio_route_over_metrics"]))
    print(write_result("profile_fast_reads_standin", payload))


if __name__ == "__main__":
    main()
