"""Near-ties on noisy steps, on the emulator: directed bursts giving up on a k at one standard
error (the default) or two (``PLUGIN__NEIGHBOUR_DROP_Z``), and trials (``DECISION__TRIALS``: a k
only bursts measured, put in as the table's k at the load's cell so it is judged on a run of
its own). Writes bench/results/burst_drop_sim.json.

On the H200 (issue 16, decode-heavy B≈127) k=2's few burst steps came out 27 % slower than its
own arm ran, one standard error of optimism left it behind k=1, the bursts stopped and the
daemon settled 7.2 % behind the best k. The emulator's ``serving-decode-heavy`` scenario has the
same near-ties (B=120-144: k=2 best, k=1 6-11 % behind, k=3 running from the profile's table);
each step's time is drawn with a relative spread ``--step-noise`` (0.6: the H200 fixed arms'
steps spread 0.51-0.68 of their mean at that load, bench/results/burst_vs_run_h200.json). Per
load, seed and arm (``ARMS``: default settings but the arm's) the daemon runs ``--horizon-s``
from the profile's table; scored as in live_step_time_sim.py: the final
table's true loss at the load, and the loss of every step run over the last 30 s (bursts and
trials included: what exploring costs).

    .venv/bin/python bench/burst_drop_sim.py --seeds 20  # 4 loads x 20 seeds x 5 arms (~2 min)
    .venv/bin/python bench/burst_drop_sim.py --quick     # 2 loads x 3 seeds
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from bench.common import environment, write_result  # noqa: E402
from bench.live_step_time_sim import (  # noqa: E402
    HORIZON_S,
    INTERVAL_S,
    PROFILE,
    SERVING,
    arm_sweep,
    daemon_at,
    quiet,
)

LOADS = (120, 128, 136, 144)
QUICK_LOADS = (128, 144)
SEEDS = 8
# The daemon's settings per arm: bursts dropping a k at one standard error (the default) or
# two, and trials (DECISION__TRIALS: a k only bursts measured, within DECISION__TRIAL_Z
# standard errors of winning (1.5 unless set), put in as the table's k at the load's cell).
ARMS: dict[str, dict[str, str]] = {
    "z=1": {"PLUGIN__NEIGHBOUR_DROP_Z": "1"},
    "z=2": {"PLUGIN__NEIGHBOUR_DROP_Z": "2"},
    "trials": {"DECISION__TRIALS": "true"},
    "trials z=1": {"DECISION__TRIALS": "true", "DECISION__TRIAL_Z": "1"},
    "trials z=2": {"DECISION__TRIALS": "true", "DECISION__TRIAL_Z": "2"},
}
STEP_NOISE = 0.6


def run_once(
    load: int,
    seed: int,
    arm: dict[str, str],
    noise: float,
    horizon_s: float,
    interval_s: float,
    workdir: Path,
) -> dict[str, Any]:
    run = daemon_at(
        load,
        workdir,
        overrides={"seed": seed, "step_noise": noise},
        horizon_s=horizon_s,
        interval_s=interval_s,
        **arm,
    )
    return {
        "seed": seed,
        "k_at_load": k_at(run["table_after"], load),
        "best_k": k_at(run["oracle_table"], load),
        "table_loss": run["table_loss"],
        "measured_loss": run["measured_loss"],
    }


def k_at(table: list[list[int]], load: int) -> int:
    return next(k for low, high, k in table if low <= load <= high)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "runs": len(runs),
        "ended_on_the_best_k": sum(r["k_at_load"] == r["best_k"] for r in runs) / len(runs),
        "table_loss_mean": statistics.fmean(r["table_loss"] for r in runs),
        "table_loss_worst": max(r["table_loss"] for r in runs),
        "measured_loss_mean": statistics.fmean(r["measured_loss"] for r in runs),
    }


def result_name(horizon_s: float, interval_s: float) -> str:
    """burst_drop_sim[_<horizon>s][_cycle<interval>s]: the defaults leave the name bare."""
    name = "burst_drop_sim"
    if horizon_s != HORIZON_S:
        name += f"_{horizon_s:g}s"
    if interval_s != INTERVAL_S:
        name += f"_cycle{interval_s:g}s"
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--step-noise", type=float, default=STEP_NOISE)
    parser.add_argument("--horizon-s", type=float, default=HORIZON_S)
    parser.add_argument("--interval-s", type=float, default=INTERVAL_S, help="the daemon's cycle")
    args = parser.parse_args()
    if args.seeds is not None and args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if not (args.horizon_s > 0 and args.interval_s > 0):
        parser.error("--horizon-s and --interval-s must be > 0")
    if not 0 <= args.step_noise <= 1:
        parser.error("--step-noise must be within 0..1 (the scenario's bound)")
    quiet()
    loads = QUICK_LOADS if args.quick else LOADS
    seeds = args.seeds or (3 if args.quick else SEEDS)
    per_load = arm_sweep(
        loads,
        ARMS,
        seeds,
        lambda load, seed, arm, workdir: run_once(
            load, seed, arm, args.step_noise, args.horizon_s, args.interval_s, workdir
        ),
        summary,
    )
    everything = {
        name: summary([r for v in per_load.values() for r in v[name]["runs"]]) for name in ARMS
    }
    write_result(
        result_name(args.horizon_s, args.interval_s),
        {
            "meta": environment(),
            "scenario": SERVING,
            "profile": str(PROFILE.relative_to(ROOT)),
            "step_noise": args.step_noise,
            "horizon_s": args.horizon_s,
            "interval_s": args.interval_s,
            "loads": list(loads),
            "seeds": seeds,
            "all_loads": everything,
            "per_load": per_load,
        },
        smoke=args.quick,
    )


if __name__ == "__main__":
    main()
