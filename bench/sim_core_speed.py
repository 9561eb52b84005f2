"""How fast the pure EngineSim runs (no HTTP): simulated seconds per wall second, for the plain
table (steps of one k counted in one go), the plugin's StepPolicy (exploration + hysteresis,
read once per step) and a ``choose_k`` callable.

    .venv/bin/python bench/sim_core_speed.py --out bench/results/sim-core-speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

from tabletune.sim.build import build_engine, resolve_profile, start_engine_side
from tabletune.sim.scenario import load_scenario


def measure(label: str, make: object, sim_seconds: float) -> dict[str, object]:
    engine = make()  # type: ignore[operator]
    start = time.perf_counter()
    engine.advance(sim_seconds)
    wall = time.perf_counter() - start
    return {
        "case": label,
        "sim_seconds": sim_seconds,
        "wall_seconds": wall,
        "steps": engine.counters.steps,
        "sim_seconds_per_wall_second": sim_seconds / wall,
        "steps_per_wall_second": engine.counters.steps / wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", default="load-sweep")
    parser.add_argument("--sim-seconds", type=float, default=3600.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    scenario, base = load_scenario(args.scenario)
    profile = resolve_profile(scenario, base, None)
    explore = scenario.model_copy(
        update={
            "engine": scenario.engine.model_copy(
                update={"exploration_interval": 50, "hysteresis": 4}
            )
        }
    )

    def plain() -> object:
        return build_engine(scenario, profile, base_dir=base)

    def policy() -> object:
        engine = build_engine(explore, profile, base_dir=base)
        start_engine_side(explore, engine)
        return engine

    def callable_policy() -> object:
        return build_engine(scenario, profile, base_dir=base, choose_k=lambda b, i: 3)

    cases = [
        measure("table (plain lookup list)", plain, args.sim_seconds),
        measure("plugin StepPolicy (exploration 50, hysteresis 4)", policy, args.sim_seconds),
        measure("choose_k callable", callable_policy, args.sim_seconds),
    ]
    result = {
        "what": "EngineSim.advance over the load-sweep scenario, sample profile, no noise",
        "command": "bench/sim_core_speed.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
        "cases": cases,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": f"CPU only: {platform.machine()}, {os.cpu_count()} cores (shared)",
        "engine": "tabletune sim (emulated vLLM 0.26.0); no GPU, no vLLM",
        "python": platform.python_version(),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
