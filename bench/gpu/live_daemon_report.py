"""bench/gpu/live_daemon.py's JSON -> bench/results/live_daemon_h200.json (one H200 launch).

What it reports:
- fixed-k references (tokens/s per window, mean, spread), in the fixed-k part and again after
  the daemon part, rotated with the daemon's last table;
- neighbour bursts: the mean step time of the k=2 steps measured inside bursts on a k=3 table
  against the fixed k=2 arms' (the plugin leaves the step before each burst and its last out of
  the cells: they draft another k than they verify);
- the daemon part: tokens/s per window and the table it ran, and its loss against the best
  fixed k measured in the same rotation;
- a replay: the step cells the daemon part recorded, fed window by window into this
  checkout's estimator and decision (what the daemon at this commit would have decided on
  the same counters). A replay, not a live run: it is labelled as such.

    .venv/bin/python bench/gpu/live_daemon_report.py RAW.json [--out OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from tabletune import __version__  # noqa: E402
from tabletune.admin.protocol import EngineIdentity  # noqa: E402
from tabletune.admin.state import TableState  # noqa: E402
from tabletune.daemon.decide import Estimates, decide  # noqa: E402
from tabletune.daemon.profiles import load_pools  # noqa: E402
from tabletune.daemon.settings import load_settings  # noqa: E402
from tabletune.daemon.step_time import StepTimeEstimator, StepTimeLayout  # noqa: E402
from tabletune.step_cells import CellTotals, cells_from_wire  # noqa: E402

Row = dict[str, Any]


def spread(values: list[float]) -> Row:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"tokens_per_s": values, "mean": mean, "stdev": sd, "cv": sd / mean if mean else None}


QUIET_EVENTS = {"push held after a rollback"}  # logged every cycle the hold lasts
NOTABLE_LINES = 400


def notable_log_lines(log_lines: list[str], *, limit: int = NOTABLE_LINES) -> list[str]:
    """The daemon log's lines that say what it did, for a part longer than its tail holds: every
    line but a cycle that changed nothing and the repeats of a hold (the first of each run of
    them kept), the last ``limit`` of them. A line that is not JSON is kept (it may be an
    error)."""
    kept: list[str] = []
    last_event = None
    for line in log_lines:
        try:
            record = json.loads(line)
        except ValueError:
            kept.append(line)
            last_event = None
            continue
        event = record.get("event") if isinstance(record, dict) else None
        quiet_cycle = event == "cycle done" and not any(
            record.get(key) for key in ("pushed", "failed", "rolled_back", "forgotten", "problems")
        )
        repeat = event in QUIET_EVENTS and event == last_event
        if not quiet_cycle and not repeat:
            kept.append(line)
        if not quiet_cycle:
            last_event = event
    return kept[-limit:]


def log_events(log_lines: Iterable[str]) -> Iterator[Row]:
    """The daemon log's JSON events, in order (a line that is not one is skipped)."""
    for line in log_lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


def trial_at_stop(log_lines: list[str]) -> Row | None:
    """The trial in force when the daemon stopped, from its JSON log: the last table it pushed
    started one (``trial`` set; logs from before that field: a reason "trial of ..."). Its
    ``standing`` is the table the trial replaced, the one the daemon stood on; None when the
    last push was no trial (or nothing was pushed)."""
    last = None
    for event in log_events(log_lines):
        if event.get("event") == "table pushed":
            last = event
    if last is None or last.get("old") is None:
        return None
    started = last.get("trial") is not None or str(last.get("reason", "")).startswith("trial of ")
    if not started:
        return None
    return {"trial": last.get("trial"), "reason": last.get("reason"), "table": last["new"],
            "standing": last["old"]}  # fmt: skip


def rollback_holds(raw: Row, part: str) -> list[tuple[float, float]]:
    """When rollbacks held the daemon's pushes in ``part``, in seconds since it started: from
    each rollback for the guard's cooldown (the launch's setting, else the default), or until
    the daemon logged that a traffic shift ended it. A rollback is read from its
    ``TableTuneRollback`` event, or (a log kept only in part) from a ``push held after a
    rollback`` line, whose hold ends ``for_s`` after it. While one holds, the bursts run at
    the re-check interval, so exploring read then costs less than it does outside one."""
    timed = {"since_daemon_start_s", "started_utc"}
    windows = [w for w in raw["windows"] if w["part"] == part and timed <= set(w)]
    if not windows:
        return []
    first = windows[0]
    origin = datetime.fromisoformat(first["started_utc"]).timestamp()
    origin -= first["since_daemon_start_s"]
    env = ((raw["meta"].get("daemon") or {}).get("settings_from_env")) or {}
    cooldown = load_settings(env).guard.cooldown_s
    lines = [*raw.get("daemon_log_events", {}).get(part, []),
             *raw.get("daemon_log_tails", {}).get(part, [])]  # fmt: skip
    holds: list[tuple[float, float]] = []
    ended: list[float] = []
    for event in log_events(lines):
        if not event.get("timestamp"):
            continue
        at = datetime.fromisoformat(event["timestamp"]).timestamp() - origin
        name = event.get("event")
        if name == "alert event" and event.get("alertname") == "TableTuneRollback":
            holds.append((at, at + cooldown))
        elif name == "push held after a rollback" and "for_s" in event:
            end = at + float(event["for_s"])
            holds.append((end - cooldown, end))
        elif name == "rollback hold ended: the traffic shifted":
            ended.append(at)
    out: list[tuple[float, float]] = []
    for start, end in sorted(holds):
        if out and start - out[-1][0] <= 5:  # the same rollback, read again (for_s is whole)
            continue
        out.append((round(start, 1), round(min([end, *(t for t in ended if t > start)]), 1)))
    return out


def overlap_s(span: tuple[float, float], holds: Sequence[tuple[float, float]]) -> float:
    """Seconds of ``span`` inside any of ``holds`` (which do not overlap each other)."""
    return sum(max(0.0, min(span[1], b) - max(span[0], a)) for a, b in holds)


def arm_windows(raw: Row, part: str, arm: str) -> list[Row]:
    return [w for w in raw["windows"] if w["part"] == part and w["arm"] == arm]


def mean_step_ms(windows: list[Row], k: int) -> float | None:
    steps = seconds = 0.0
    for window in windows:
        cells, _ = cells_from_wire(window["cells"])
        for (cell_k, _, _), totals in cells.items():
            if cell_k == k:
                steps += totals.steps
                seconds += totals.seconds
    return 1000.0 * seconds / steps if steps else None


def captured_k(meta: Row) -> frozenset[int] | None:
    """The k the plugin allows: those of the engine's starting table (vLLM captured them);
    None where the run did not record it."""
    engine = meta.get("starting_table")
    if not engine:
        return None
    return TableState.initial(engine, num_speculative_tokens=3, max_num_seqs=256).allowed_k


def replay(raw: Row, *, rates: tuple[float, ...], load: int, part: str = "daemon") -> list[Row]:
    """A daemon part's recorded step cells through this checkout's estimator and decision,
    each window's decision from the daemon's start table. The k allowed are the engine's (its
    starting table's, the k vLLM captured), as the plugin allows them, not only the k of the
    table the daemon started from."""
    meta = raw["meta"]["daemon"]
    settings = load_settings({"TABLETUNE_PROFILE__PATHS": str(ROOT / meta["profile"])})
    pool = load_pools(settings.profile)[0]
    estimator = StepTimeEstimator(StepTimeLayout.of_pool(pool))
    step_time = settings.step_time
    params = step_time.blend_params()
    plugin = settings.plugin
    start = TableState.initial(meta["start_table"], num_speculative_tokens=3, max_num_seqs=256)
    state = replace(
        start,
        allowed_k=captured_k(raw["meta"]) or start.allowed_k,
        exploration_interval=plugin.exploration_interval,
        hysteresis=plugin.hysteresis,
    )
    view = state.view(plugin_version=__version__, identity=EngineIdentity("0.26.0"))
    out = []
    elapsed = 0.0
    for window in raw["windows"]:
        if window["part"] != part:
            continue
        elapsed += window["wall_s"]
        cells: dict[Any, CellTotals] = cells_from_wire(window["cells"])[0]
        step_time.feed(estimator, cells, elapsed)
        estimate = estimator.estimate(params, prior_sigma=pool.relative_sigma)
        decision = decide(
            estimates=Estimates(
                estimate.step_times, rates, estimate.relative_sigma, unproven=estimate.unproven
            ),
            view=view,
            load_weights={load: 1.0},
            settings=settings.decision,
            min_width=2 * plugin.hysteresis + 1,
        )
        new = decision.new or ()
        k_at_load = next((k for start, end, k in new if start <= load <= end), None)
        out.append({"after_s": round(elapsed, 1), "push": decision.push, "k_at_load": k_at_load,
                    "reason": decision.reason})  # fmt: skip
    return out


def report(raw: Row) -> Row:
    references = [w for w in raw["windows"] if w["part"] in ("fixed-k", "after-daemon")]
    fixed = {
        arm: [w["tokens_per_s"] for w in references if w["arm"] == arm] for arm in ("k2", "k3")
    }
    best = max(statistics.fmean(v) for v in fixed.values())
    daemon_windows = [w for w in raw["windows"] if w["part"] == "daemon"]
    daemon = [w["tokens_per_s"] for w in daemon_windows]
    start_table = raw["meta"]["daemon"]["start_table"]
    changed = next(
        (i for i, w in enumerate(daemon_windows) if w["view"]["table"] != start_table), None
    )
    # Whole windows under the daemon's new table: those after the one it changed in.
    steady = [] if changed is None else daemon[changed + 1 :]
    last_table = [w["tokens_per_s"] for w in arm_windows(raw, "after-daemon", "daemon")]
    bursts = [w for w in raw["windows"] if w["part"] == "bursts"]
    fixed_k2 = arm_windows(raw, "fixed-k", "k2") + arm_windows(raw, "after-daemon", "k2")
    load = round(statistics.fmean(w["mean_running"] for w in raw["windows"] if w["mean_running"]))
    replayed = replay(raw, rates=tuple(raw["meta"]["synthetic_rates"]), load=load)
    first_switch = next((r["after_s"] for r in replayed if r["k_at_load"] not in (None, 3)), None)
    daemon_table = raw.get("daemon_table")
    return {
        "meta": raw["meta"],
        "fixed_k": {arm: spread(values) for arm, values in fixed.items()},
        "bursts": {
            "k2_step_ms_in_bursts": mean_step_ms(bursts, 2),
            "k2_step_ms_fixed_arms": mean_step_ms(fixed_k2, 2),
        },
        "daemon": {
            "windows": spread(daemon),
            "table_at_end": daemon_table,
            "last_table_rotated_with_fixed_k": spread(last_table) if last_table else None,
            "loss_vs_best_fixed_k": 1.0 - statistics.fmean(daemon) / best,
            "table_changed_in_window_ending_s": None
            if changed is None
            else daemon_windows[changed].get("since_daemon_start_s"),
            "windows_after_the_change": spread(steady) if steady else None,
            "loss_after_the_change_vs_best_fixed_k": (
                1.0 - statistics.fmean(steady) / best if steady else None
            ),
        },
        "replay_at_this_commit": {
            "note": "the daemon part's recorded step cells fed into this checkout's estimator "
            "and decision window by window: what it would decide on the same counters; not a "
            "live run",
            "load": load,
            "decisions": replayed,
            "first_switch_off_k3_after_s": first_switch,
        },
        "errors": raw["errors"],
        "skipped": raw["skipped"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "live_daemon_h200.json"))
    args = parser.parse_args()
    raw = json.loads(Path(args.raw).read_text())
    result = report(raw)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("fixed_k", "bursts")}, indent=1))
    print(json.dumps(result["daemon"], indent=1))
    print(json.dumps(result["replay_at_this_commit"]["first_switch_off_k3_after_s"]))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
