"""The shape change's daemon part replayed through this checkout's estimator and decision: the
recorded step cells summed into the daemon's cycles, each cycle's decision taken against the
table the live daemon ran in its last window (so it says what this checkout would do from
where the live daemon stood), the load weights from the cycle's own steps (steps per mean
batch; the live daemon fades them over cycles). It does not replay the live daemon itself:
its cycles start where the part's windows do, and its pushes are not fed back. Writes
bench/results/change_replay_h200.json. ``--setting NAME=VALUE`` (repeatable) replays with a
daemon setting changed, named as its variable without the TABLETUNE_ prefix (e.g.
``STEP_TIME__SETTLE_S=0``); write such a replay elsewhere with ``--out``.

    .venv/bin/python bench/gpu/change_replay.py \\
        bench/results/gpu_raw/eval_traffic_*blocks_h200_*.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from live_daemon_report import captured_k  # noqa: E402  (this script's folder is on sys.path)
from shift_replay import CYCLE_S, cycles  # noqa: E402

from tabletune import __version__  # noqa: E402
from tabletune.admin.protocol import EngineIdentity  # noqa: E402
from tabletune.admin.state import TableState  # noqa: E402
from tabletune.daemon.decide import Estimates, decide  # noqa: E402
from tabletune.daemon.explore import directed_exploration  # noqa: E402
from tabletune.daemon.profiles import load_pools  # noqa: E402
from tabletune.daemon.settings import (  # noqa: E402
    ENV_PREFIX,
    DaemonSettings,
    load_settings,
    setting_overrides,
)
from tabletune.daemon.step_time import (  # noqa: E402
    MEASURED_STEPS,
    StepTimeEstimator,
    StepTimeLayout,
)
from tabletune.errors import InputError  # noqa: E402
from tabletune.schemas.table import dense_lookup  # noqa: E402
from tabletune.step_cells import CellKey, CellTotals  # noqa: E402

Row = dict[str, Any]
MAX_NUM_SEQS = 256  # every launch's


def batch_weights(cells: dict[CellKey, CellTotals]) -> dict[int, float]:
    """Steps per mean batch size of each cell (every k's)."""
    weights: dict[int, float] = {}
    for totals in cells.values():
        if totals.steps > 0:
            batch = round(totals.requests / totals.steps)
            weights[batch] = weights.get(batch, 0.0) + totals.steps
    return weights


def daemon_settings(raw: Row, settings: Mapping[str, str]) -> DaemonSettings:
    """The defaults on the run's profile, with ``settings`` (names without the TABLETUNE_
    prefix) changed; InputError names a bad value."""
    profile = {"TABLETUNE_PROFILE__PATHS": str(ROOT / raw["meta"]["daemon"]["profile"])}
    return load_settings({**profile, **{ENV_PREFIX + k: v for k, v in settings.items()}})


def replay(
    raw: Row, cycle_s: float = CYCLE_S, setting_changes: Mapping[str, str] | None = None
) -> list[Row]:
    """Per cycle of the change's daemon part: seconds since the change, the table run, and
    whether this checkout would push, what and why (with ``setting_changes`` made, names as in
    daemon_settings)."""
    change = raw["shape_change"]
    meta = raw["meta"]
    settings = daemon_settings(raw, setting_changes or {})
    pool = load_pools(settings.profile)[0]
    estimator = StepTimeEstimator(StepTimeLayout.of_pool(pool))
    step_time, plugin = settings.step_time, settings.plugin
    rates = tuple(meta["synthetic_rates"])
    windows = (w for w in raw["windows"] if w["part"] == f"{change['part']}-daemon")
    allowed = captured_k(meta)  # the plugin allows the engine's k, whatever the table in force
    out = []
    for elapsed, last, cells in cycles(windows, cycle_s):
        step_time.feed(estimator, cells, elapsed)
        estimate = estimator.estimate(step_time.blend_params(), prior_sigma=pool.relative_sigma)
        ran = last["view"]["table"]
        running = TableState.initial(ran, num_speculative_tokens=3, max_num_seqs=MAX_NUM_SEQS)
        state = replace(
            running, allowed_k=allowed or running.allowed_k,
            exploration_interval=plugin.exploration_interval, hysteresis=plugin.hysteresis,
        )  # fmt: skip
        weights = batch_weights(cells) or {change["clients"]: 1.0}
        # The k the plugin's bursts would be sent to (the daemon's directed exploration).
        ks = pool.step_times.ks
        lookup = dense_lookup([(int(a), int(b), int(k)) for a, b, k in ran], MAX_NUM_SEQS, max(ks))
        bursts = directed_exploration(
            estimate, pool.step_times, rates, lookup, weights, ks,
            min_steps=MEASURED_STEPS, z=plugin.neighbour_drop_z,
        ).ks  # fmt: skip
        estimates = Estimates(
            estimate.step_times, rates, estimate.relative_sigma, unproven=estimate.unproven
        )
        decision = decide(
            estimates=estimates,
            view=state.view(plugin_version=__version__, identity=EngineIdentity("0.26.0")),
            load_weights=weights,
            settings=settings.decision,
            min_width=2 * plugin.hysteresis + 1,
        )
        out.append({
            "since_change_s": round(last["since_daemon_start_s"] - change["at_s"], 1),
            "ran": ran, "push": decision.push,
            "new": [list(r) for r in decision.new] if decision.push and decision.new else None,
            "reason": decision.reason, "bursts_at": list(bursts),
        })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/change_replay_h200.json")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a daemon setting changed for the replay, named as its variable "
                        "without the TABLETUNE_ prefix, e.g. STEP_TIME__SETTLE_S=0")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        settings = setting_overrides(args.setting)
    except InputError as error:
        parser.error(f"--setting {error}")
    changes = []
    for path in args.raw:
        raw = json.loads(path.read_text())
        if (raw.get("shape_change") or {}).get("at_s") is not None:
            changes.append({"raw": path.name, "cycles": replay(raw, setting_changes=settings)})
    result = {
        "what": __doc__.splitlines()[0],
        "command": "bench/gpu/change_replay.py "
        "bench/results/gpu_raw/eval_traffic_*blocks_h200_*.json"
        + "".join(f" --setting {name}={value}" for name, value in settings.items()),
        **({"settings": settings} if settings else {}),
        "cycle_s": CYCLE_S,
        "changes": changes,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(changes)} shape changes replayed; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
