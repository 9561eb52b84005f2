"""The emulator's serving-decode-heavy scenario over several seeds: one seed says little.

bench/live_step_time_sim.py runs each load once, on the scenario's own seed (8). This runs the
same daemon (``daemon_at``: the profile's table at the start, 15 s cycles, 120 s, scored on the
true expected step time of every step run) at each load once per seed 1..N, for each arm of
daemon settings (by default: the defaults, the acceptance exploration unpriced, no hold on a k
its estimate oversold; else each ``--arm``, ``GROUP__NAME=VALUE``, comma-separated for several,
"" for the defaults). Per arm and load: the k the table ended on, its loss, the loss of the
steps run over the last 30 s (exploring included), per seed and summed up.

    .venv/bin/python bench/serving_seeds_sim.py     # 15 loads, 16 seeds, 3 arms: ~90 s here
    .venv/bin/python bench/serving_seeds_sim.py --loads 160 --seeds 4 \
        --arm DECISION__OVERSOLD_FOR_S=0
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from bench.common import environment, write_result  # noqa: E402
from bench.live_step_time_sim import LOADS, daemon_at, quiet, settings_of  # noqa: E402

SEEDS = 16
# "": the defaults; the acceptance exploration unpriced; no hold on oversold k; a k a few
# bursts measured kept from replacing a measured one
DEFAULT_ARMS = (
    "",
    "PLUGIN__EXPLORATION_COST_BUDGET=0",
    "DECISION__OVERSOLD_FOR_S=0",
    "DECISION__CHALLENGER_MIN_STEPS=30",
)


def arm_settings(arm: str) -> dict[str, str]:
    """An arm's daemon settings ("" for the defaults), each checked as live_step_time_sim's."""
    return settings_of([part for part in arm.split(",") if part]) if arm else {}


def summed(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What a load's runs say together."""
    losses = [r["table_loss"] for r in runs]
    measured = [r["measured_loss"] for r in runs]
    return {
        "runs": len(runs),
        "table_right": sum(1 for x in losses if x <= 1e-9),
        "table_loss_mean": sum(losses) / len(losses),
        "table_loss_worst": max(losses),
        "measured_loss_mean": sum(measured) / len(measured),
        "measured_loss_worst": max(measured),
    }


def sweep(arm: dict[str, str], loads: Sequence[int], seeds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for load in loads:
        runs = []
        for seed in range(1, seeds + 1):
            with tempfile.TemporaryDirectory() as workdir:
                result = daemon_at(load, Path(workdir), overrides={"seed": seed}, **arm)
            runs.append({
                "seed": seed, "final_k": result["table_k_by_time"][-1][1],
                "table_loss": result["table_loss"], "measured_loss": result["measured_loss"],
            })  # fmt: skip
        summary = summed(runs)
        out[str(load)] = {**summary, "per_seed": runs}
        print(f"{arm or 'defaults'} B={load}: {json.dumps(summary)}", flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--loads", type=lambda s: [int(x) for x in s.split(",")], default=LOADS)
    parser.add_argument("--seeds", type=int, default=SEEDS)
    parser.add_argument("--arm", action="append", metavar="GROUP__NAME=VALUE[,...]")
    args = parser.parse_args(argv)
    if args.seeds < 1 or any(load < 1 for load in args.loads):
        parser.error("--seeds and every load must be at least 1")
    arms = {arm: arm_settings(arm) for arm in (args.arm or DEFAULT_ARMS)}  # refused up front
    quiet()
    started = time.perf_counter()
    payload = {
        "what": "serving-decode-heavy over seeds (bench/serving_seeds_sim.py)",
        "command": " ".join(["bench/serving_seeds_sim.py", *(argv or sys.argv[1:])]),
        **environment(engine_version="vLLM 0.26.0, emulated (tabletune sim); no GPU"),
        "seeds": list(range(1, args.seeds + 1)),
        "arms": {
            name or "defaults": sweep(env, args.loads, args.seeds) for name, env in arms.items()
        },
    }
    payload["wall_s"] = time.perf_counter() - started
    print(f"wrote {write_result('serving_seeds_sim', payload)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
