"""How fast the pure EngineSim runs (no HTTP): simulated seconds per wall second, for the plain
table (steps of one k counted in one go), the plugin's StepPolicy (exploration + hysteresis,
read once per step) and a ``choose_k`` callable, without and with the serving model (prefill
drawn per step). Each case is the best of ``--repeat`` runs (the machine is shared).

Before/after: run this same script on the older code first, then pass its JSON as ``--before``;
cases the older code cannot run (no serving model yet) are recorded as skipped.

    PYTHONPATH=OLD/src .venv/bin/python bench/sim_core_speed.py --label OLD --out /tmp/before.json
    .venv/bin/python bench/sim_core_speed.py --before /tmp/before.json \
        --out bench/results/sim-core-speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tabletune.errors import InputError
from tabletune.sim.build import build_engine, resolve_profile, start_engine_side
from tabletune.sim.engine import EngineSim
from tabletune.sim.scenario import Scenario, load_scenario


def measure(make: Callable[[], EngineSim], sim_seconds: float, repeat: int) -> dict[str, Any]:
    runs = []
    for _ in range(repeat):
        engine = make()
        start = time.perf_counter()
        engine.advance(sim_seconds)
        runs.append((time.perf_counter() - start, engine.counters.steps))
    wall, steps = min(runs)
    return {
        "sim_seconds": sim_seconds,
        "wall_seconds": wall,
        "wall_seconds_all_runs": [w for w, _ in runs],
        "steps": steps,
        "sim_seconds_per_wall_second": sim_seconds / wall,
        "steps_per_wall_second": steps / wall,
    }


def cases_for(name: str) -> list[tuple[str, Callable[[], EngineSim]]] | None:
    """The three ways of choosing k on one scenario; None when this code has no such scenario."""
    try:
        scenario, base = load_scenario(name)
    except InputError:
        return None
    profile = resolve_profile(scenario, base, None)
    explore: Scenario = scenario.model_copy(
        update={
            "engine": scenario.engine.model_copy(
                update={"exploration_interval": 50, "hysteresis": 4}
            )
        }
    )

    def plain() -> EngineSim:  # the starting table as vLLM's dense list, no engine side
        return build_engine(scenario, profile, base_dir=base)

    def policy() -> EngineSim:
        engine = build_engine(explore, profile, base_dir=base)
        start_engine_side(explore, engine)
        return engine

    def callable_policy() -> EngineSim:
        return build_engine(scenario, profile, base_dir=base, choose_k=lambda b, i: 3)

    return [
        (f"{name}: table (plain lookup list)", plain),
        (f"{name}: plugin StepPolicy (exploration 50, hysteresis 4)", policy),
        (f"{name}: choose_k callable", callable_policy),
    ]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", action="append", help="default: load-sweep, serving-*")
    parser.add_argument("--sim-seconds", type=float, default=3600.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--label", default="this checkout", help="which code this run measured")
    parser.add_argument("--before", type=Path, help="this script's JSON from the older code")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    scenarios = args.scenario or ["load-sweep", "serving-decode-heavy"]
    before: dict[str, Any] = {}
    if args.before:
        earlier = json.loads(args.before.read_text(encoding="utf-8"))
        before = {c["case"]: c for c in earlier["cases"]}
    cases: list[dict[str, Any]] = []
    for name in scenarios:
        found = cases_for(name)
        if found is None:
            cases.append({"case": f"{name}: (all)", "skipped": "no such scenario in this code"})
            continue
        for label, make in found:
            row = {"case": label, **measure(make, args.sim_seconds, args.repeat)}
            old = before.get(label, {})
            if "sim_seconds_per_wall_second" in old:
                row["before_sim_seconds_per_wall_second"] = old["sim_seconds_per_wall_second"]
                row["speed_vs_before"] = (
                    row["sim_seconds_per_wall_second"] / old["sim_seconds_per_wall_second"]
                )
            cases.append(row)
    result = {
        "what": "EngineSim.advance on packaged scenarios, sample profile; best of --repeat runs",
        "command": "bench/sim_core_speed.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
        "code": args.label,
        "before_code": json.loads(args.before.read_text())["code"] if args.before else None,
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
