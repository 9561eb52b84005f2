"""The traffic-shift check on steady traffic: every daemon part of the users'-traffic launches
(eval_traffic.py runs of blocks, one target; the shape change's part left out) fed in the
daemon's cycles into this checkout's step-time estimator with the default settings. A part
where the check fires read a change of traffic that was not there (the clients' shape never
changed inside it). Writes bench/results/shift_replay_h200.json.

    .venv/bin/python bench/gpu/shift_replay.py \\
        bench/results/gpu_raw/eval_traffic_*blocks_h200_*.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from tabletune.daemon.profiles import load_pools  # noqa: E402
from tabletune.daemon.setting_groups import StepTimeSettings  # noqa: E402
from tabletune.daemon.settings import load_settings  # noqa: E402
from tabletune.daemon.step_time import StepTimeEstimator, StepTimeLayout  # noqa: E402
from tabletune.step_cells import CellKey, CellTotals, cells_from_wire  # noqa: E402

Row = dict[str, Any]
TARGET = "qwen3-4b"
CYCLE_S = 3.0  # the evaluation's daemon cycle (eval_traffic.py --daemon-cycle-s)


def steady_parts(raw: Row) -> list[str]:
    """The daemon parts of a launch whose traffic kept its shape (not the shape change's)."""
    parts = {w["part"] for w in raw["windows"] if w["part"].endswith("-daemon")}
    return sorted(p for p in parts if not p.startswith("change-"))


def cycles(
    windows: Iterable[Row], cycle_s: float
) -> Iterator[tuple[float, Row, dict[CellKey, CellTotals]]]:
    """The daemon's cycles over recorded windows: (seconds into the part, the cycle's last
    window, its windows' step cells summed)."""
    elapsed = waited = 0.0
    summed: dict[CellKey, CellTotals] = {}
    for window in windows:
        elapsed += window["wall_s"]
        waited += window["wall_s"]
        for key, totals in cells_from_wire(window["cells"])[0].items():
            summed[key] = summed.get(key, CellTotals()) + totals
        if waited >= cycle_s:
            yield elapsed, window, summed
            summed, waited = {}, 0.0


def shifts_in(
    windows: Iterable[Row], layout: StepTimeLayout, cycle_s: float, shift: float | None = None
) -> list[float]:
    """Seconds into the part at which the check read a change, windows summed into cycles;
    the daemon's defaults, ``shift`` (STEP_TIME__SHIFT) apart when given."""
    step_time = StepTimeSettings() if shift is None else StepTimeSettings(shift=shift)
    estimator = StepTimeEstimator(layout)
    fired = []
    for elapsed, _, cycle in cycles(windows, cycle_s):
        before = estimator.shifted.copy()
        step_time.feed(estimator, cycle, elapsed)
        if (estimator.shifted & ~before).any():
            fired.append(round(elapsed, 1))
    return fired


def replay(raw: Row, name: str, cycle_s: float = CYCLE_S, shift: float | None = None) -> list[Row]:
    profile = ROOT / raw["meta"]["daemon"]["profile"]
    pool = load_pools(load_settings({"TABLETUNE_PROFILE__PATHS": str(profile)}).profile)[0]
    layout = StepTimeLayout.of_pool(pool)
    return [
        {"raw": name, "part": part,
         "shifts_at_s": shifts_in((w for w in raw["windows"] if w["part"] == part), layout,
                                  cycle_s, shift)}
        for part in steady_parts(raw)
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/shift_replay_h200.json")
    args = parser.parse_args(argv)
    parts: list[Row] = []
    for path in args.raw:
        raw = json.loads(path.read_text())
        if raw["meta"].get("target") == TARGET:
            parts += replay(raw, path.name)
    fired = [p for p in parts if p["shifts_at_s"]]
    result = {
        "what": __doc__.splitlines()[0],
        "command": "bench/gpu/shift_replay.py "
        "bench/results/gpu_raw/eval_traffic_*blocks_h200_*.json",
        "target": TARGET,
        "cycle_s": CYCLE_S,
        "shift": StepTimeSettings().shift,  # STEP_TIME__SHIFT, the default replayed
        "steady_parts": len(parts),
        "parts_where_it_fired": len(fired),
        "parts": parts,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(fired)} of {len(parts)} steady parts read a change; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
