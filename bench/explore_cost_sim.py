"""What exploring costs the daemon over minutes, on the emulator: the price of the plugin's
neighbour bursts and acceptance steps at K once the table is right, and how fast the table gets
right, at the default burst spacing and sparser ones, re-checks of long shots at their own.
Writes bench/results/explore_cost_sim.json.

On the H200 (issue 16) the daemon's own windows after its table settled lost 1-3.6 % to its
bursts (decode-heavy B≈254: 21 % of the time at other k than the best, to the end of a 30 s
part), while its table, run with exploring off, lost 0 %. A 30 s part shows the bursts that
measure each k after a start, not what exploring costs later. Here the emulator's
``serving-decode-heavy`` scenario (steps drawn with a relative spread of 0.6, as the H200's
spread at B≈127) runs the daemon ``--horizon-s`` from the profile's table per load, seed and arm
(``ARMS``: default settings but the arm's), and each cycle's steps are priced at their true
expected goodput against the best k's (``ExpectedScore``: bursts, acceptance steps at K and
switches included). Per run: when the table's k at the load became the best and stayed, the
steps' loss from then on (what exploring costs once the table is right), over the first
``EARLY_S`` and after it, that loss over the cycles after it without bursts (what the
acceptance steps at K cost alone), and the share of those cycles with bursts.

    .venv/bin/python bench/explore_cost_sim.py            # 4 loads x 12 seeds x 9 arms (~2.5 min)
    .venv/bin/python bench/explore_cost_sim.py --quick    # 2 loads x 2 seeds, 240 s
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from bench.common import environment, write_result  # noqa: E402
from bench.live_step_time_sim import (  # noqa: E402
    INTERVAL_S,
    PROFILE,
    SERVING,
    arm_sweep,
    daemon_at,
    quiet,
)

LOADS = (64, 128, 192, 256)
QUICK_LOADS = (128, 192)
SEEDS = 12
HORIZON_S = 600.0
QUICK_HORIZON_S = 240.0
EARLY_S = 120.0  # the first minutes: the table found, every k measured; the long run after
STEP_NOISE = 0.6
# The daemon's settings per arm: the plugin's burst spacing (PLUGIN__NEIGHBOUR_INTERVAL, steps
# between bursts of PLUGIN__NEIGHBOUR_BURST=4), its spacing when the bursts only re-check long
# shots (PLUGIN__NEIGHBOUR_RECHECK_INTERVAL, 128; 0: the burst spacing, as before it existed)
# once the table has stood PLUGIN__NEIGHBOUR_RECHECK_AFTER_S (120; 0: at once)
# and acceptance steps at K (PLUGIN__EXPLORATION_INTERVAL; sparser learns acceptance beyond
# the running k more slowly, which this does not score); bursts at a measured k spaced by what
# they lose (PLUGIN__NEIGHBOUR_COST_BUDGET, 0.005 of the time; 0: not priced, as before it).
ARMS: dict[str, dict[str, str]] = {
    "default": {},
    "bursts not priced": {"PLUGIN__NEIGHBOUR_COST_BUDGET": "0"},
    "bursts priced at 1 %": {"PLUGIN__NEIGHBOUR_COST_BUDGET": "0.01"},
    "re-checks at the burst spacing": {"PLUGIN__NEIGHBOUR_RECHECK_INTERVAL": "0"},
    "neither": {"PLUGIN__NEIGHBOUR_COST_BUDGET": "0", "PLUGIN__NEIGHBOUR_RECHECK_INTERVAL": "0"},
    "re-checks sparser at once": {"PLUGIN__NEIGHBOUR_RECHECK_AFTER_S": "0"},
    "bursts every 64": {"PLUGIN__NEIGHBOUR_INTERVAL": "64"},
    "bursts every 128": {"PLUGIN__NEIGHBOUR_INTERVAL": "128"},
    "acceptance every 100": {"PLUGIN__EXPLORATION_INTERVAL": "100"},
}


def run_once(
    load: int, seed: int, arm: dict[str, str], workdir: Path, *, horizon_s: float
) -> dict[str, Any]:
    """One run of the daemon with ``arm``'s settings, read by ``run_summary``."""
    run = daemon_at(load, workdir, overrides={"seed": seed, "step_noise": STEP_NOISE},
                    horizon_s=horizon_s, record_cycles=True, **arm)  # fmt: skip
    return {"seed": seed, **run_summary(run["cycles"], run["table_loss"])}


def run_summary(cycles: list[dict[str, Any]], table_loss: float) -> dict[str, Any]:
    """One run's cycles (``daemon_at(record_cycles=True)``) read as the module says."""
    right_from = None
    for cycle in reversed(cycles):  # the last stretch of cycles on the best k
        if cycle["table_k"] != cycle["best_k"]:
            break
        right_from = cycle["at_s"]
    # The cycle that pushed the right table ran under the one before: the ones after it count.
    right = [c["steps_loss"] for c in cycles if right_from is not None and c["at_s"] > right_from]
    early = [c["steps_loss"] for c in cycles if c["at_s"] <= EARLY_S]
    late = [c for c in cycles if c["at_s"] > EARLY_S]
    quiet_cycles = [c["steps_loss"] for c in late if not c["burst_spacing"]]
    return {
        "right_table_from_s": right_from,
        "table_loss_at_end": round(table_loss, 4),
        "steps_loss_once_right": round(statistics.fmean(right), 4) if right else None,
        "steps_loss_early": round(statistics.fmean(early), 4) if early else None,
        "steps_loss_late": round(statistics.fmean(c["steps_loss"] for c in late), 4)
        if late
        else None,
        "steps_loss_late_without_bursts": round(statistics.fmean(quiet_cycles), 4)
        if quiet_cycles
        else None,
        "late_cycles_with_bursts": round(sum(c["burst_spacing"] > 0 for c in late) / len(late), 3)
        if late
        else None,
    }


SUMMED = ("right_table_from_s", "table_loss_at_end", "steps_loss_once_right",
          "steps_loss_early", "steps_loss_late", "steps_loss_late_without_bursts",
          "late_cycles_with_bursts")  # fmt: skip


def arm_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over seeds (a run that never settled on the best k counts in ``never_right``)."""

    def mean(field: str) -> float | None:
        values = [r[field] for r in runs if r[field] is not None]
        return round(statistics.fmean(values), 4) if values else None

    return {
        "runs": len(runs),
        "never_right": sum(r["right_table_from_s"] is None for r in runs),
        **{field: mean(field) for field in SUMMED},
        "steps_loss_late_worst": max(
            (r["steps_loss_late"] for r in runs if r["steps_loss_late"] is not None), default=None
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--horizon-s", type=float, default=None)
    args = parser.parse_args(argv)
    horizon = args.horizon_s or (QUICK_HORIZON_S if args.quick else HORIZON_S)
    if args.seeds is not None and args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if horizon <= EARLY_S:
        parser.error(f"--horizon-s must be past {EARLY_S:g} (the early part)")
    quiet()
    loads = QUICK_LOADS if args.quick else LOADS
    seeds = args.seeds or (2 if args.quick else SEEDS)
    per_load = arm_sweep(loads, ARMS, seeds, partial(run_once, horizon_s=horizon), arm_summary)
    worst = {
        name: max(
            (v[name]["summary"]["steps_loss_once_right"] or 0.0 for v in per_load.values()),
            default=0.0,
        )
        for name in ARMS
    }
    path = write_result(
        "explore_cost_sim",
        {
            "meta": environment(),
            "command": "bench/explore_cost_sim.py" + (" --quick" if args.quick else ""),
            "scenario": SERVING,
            "profile": str(PROFILE.relative_to(ROOT)),
            "step_noise": STEP_NOISE,
            "horizon_s": horizon,
            "cycle_s": INTERVAL_S,
            "early_s": EARLY_S,
            "loads": list(loads),
            "seeds": seeds,
            "arms": ARMS,
            "worst_load_steps_loss_once_right": worst,
            "per_load": per_load,
        },
        smoke=args.quick,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
