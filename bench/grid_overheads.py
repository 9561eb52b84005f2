"""Where an in-flight grid's time went, from one raw profile (``*.raw.json``) and, next to it,
its summary (``*.summary.json``: the read and event counts): the windows' own steps, the steps
beyond ``window_steps`` that windows ran on for (a read landing late; a first read planned from
a much slower cell), the steps between two windows that no window counts (the tail at the old
k and the switch step), the reads, the k switches, the fresh starts and adds. Seconds over the
grid, per window where it helps.

The steps between windows come from each window's ``engine_steps`` where the raw file has it,
else from its estimated mean context: within one holding (same batch size, no fresh start)
every request gains a token a step, so two consecutive windows' contexts differ by half the
engine steps between their readings.

    python bench/grid_overheads.py RUN/profile.raw.json [--out FILE.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tabletune.profiler.settings import InFlightSettings

Window = dict[str, Any]
OVER_PLANNED = 2.0
"""a window of at least this many times ``window_steps`` ran on for a read planned too late"""


def _uncounted_from_context(windows: Sequence[Window]) -> list[tuple[float, float]]:
    """(uncounted steps per window, their seconds) of each consecutive pair in one holding."""
    out = []
    for a, b in itertools.pairwise(windows):
        if a["batch_size"] != b["batch_size"] or b["context_tokens"] <= a["context_tokens"]:
            continue  # an add or a fresh start in between: contexts say nothing
        steps = b["context_tokens"] - a["context_tokens"] - (a["steps"] + b["steps"]) / 2
        out.append((steps, steps * (a["step_ms"] + b["step_ms"]) / 2000))
    return out


def _uncounted_recorded(windows: Sequence[Window]) -> list[tuple[float, float]]:
    """(uncounted steps, their seconds) of each window that recorded its engine steps."""
    return [
        (w["engine_steps"] - w["steps"], (w["engine_steps"] - w["steps"]) * w["step_ms"] / 1000)
        for w in windows
        if w.get("engine_steps") is not None
    ]


def uncounted(windows: Sequence[Window]) -> dict[str, Any]:
    """Steps between windows that no window counts, over the grid (extrapolated from the
    windows where they are known)."""
    pairs = _uncounted_recorded(windows)
    source = "engine_steps recorded per window"
    if not pairs:
        pairs, source = _uncounted_from_context(windows), "estimated from contexts"
    if not pairs:
        return {"source": "none: no two windows in one holding"}
    per_window_s = statistics.fmean(s for _, s in pairs)
    return {
        "source": source,
        "windows_known": len(pairs),
        "steps_per_window": statistics.fmean(n for n, _ in pairs),
        "steps_per_window_counts": dict(sorted(Counter(round(n) for n, _ in pairs).items())),
        "ms_per_window": 1000 * per_window_s,
        "grid_s": per_window_s * len(windows),
    }


def beyond_window(windows: Sequence[Window], window_steps: int) -> dict[str, Any]:
    """Steps windows ran on for beyond ``window_steps``: over-planned first reads (a window
    of ``OVER_PLANNED`` times its steps or more) apart from the usual late close."""
    over = [w for w in windows if w["steps"] >= OVER_PLANNED * window_steps]
    late = [w for w in windows if window_steps < w["steps"] < OVER_PLANNED * window_steps]

    def seconds(group: Sequence[Window]) -> float:
        return sum((w["steps"] - window_steps) * w["seconds"] / w["steps"] for w in group)

    return {
        "late_close": {
            "windows": len(late),
            "steps": sum(w["steps"] - window_steps for w in late),
            "grid_s": seconds(late),
        },
        "over_planned": {
            "windows": len(over),
            "steps": sum(w["steps"] - window_steps for w in over),
            "grid_s": seconds(over),
            "cells": [[w["batch_size"], w["k"], w["round"], w["steps"]] for w in over],
        },
    }


def reads(windows: Sequence[Window], wall: dict[str, float], events: dict[str, int]) -> Any:
    count = events.get("reads", 0)
    recorded = [w["reads"] for w in windows if w.get("reads") is not None]
    out: dict[str, Any] = {
        "reads": count,
        "per_window": count / len(windows) if windows else None,
        "ms_per_read": 1000 * wall.get("timing.read", 0.0) / count if count else None,
        "grid_s": wall.get("timing.read"),
    }
    if recorded:
        out["per_window_counts"] = dict(sorted(Counter(recorded).items()))
    return out


def per_event(seconds: float | None, count: int) -> float | None:
    return None if seconds is None or not count else 1000 * seconds / count


def _starts_first_windows(windows: Sequence[Window]) -> list[Window]:
    """The first window after each start (requests added or started over): the grid's first,
    and each one at another batch size or a lower context than the window before."""
    return windows[:1] + [
        b
        for a, b in itertools.pairwise(windows)
        if a["batch_size"] != b["batch_size"] or b["context_tokens"] < a["context_tokens"]
    ]


def savings(windows: Sequence[Window], analysis: dict[str, Any]) -> dict[str, Any]:
    """What the profiler's changes of this branch would have saved on a grid measured before
    them (an estimate from its raw windows; meaningless for a grid measured after them):

    - ``first_read_from_the_cell``: over-planned windows close within a step of their last;
    - ``k_set_before_sending``: the window after a start needs no switch: its uncounted steps
      (the mean between windows) go, less a k switch's round trip (still paid while requests
      are added, before the send);
    - ``settle_from_the_send_reading``: one read fewer per start (at most its round trip)."""
    steps = analysis["window_steps"]
    over = [w for w in windows if w["steps"] >= OVER_PLANNED * steps]
    over_s = sum((w["steps"] - steps - 1) * w["seconds"] / w["steps"] for w in over)
    gap_steps = analysis["between_windows"].get("steps_per_window", 0.0)
    switch_ms = analysis["k_switches"]["ms_per_switch"] or 0.0
    firsts = _starts_first_windows(windows)
    before_sending_s = sum(max(0.0, gap_steps * w["step_ms"] - switch_ms) / 1000 for w in firsts)
    read_ms = analysis["reads"]["ms_per_read"] or 0.0
    starts = (analysis["starts"]["fresh_starts"] or 0) + (analysis["starts"]["adds"] or 0)
    out = {
        "first_read_from_the_cell_s": over_s,
        "k_set_before_sending_s": before_sending_s,
        "starts_seen": len(firsts),
        "settle_from_the_send_reading_s": starts * read_ms / 1000,
    }
    return out | {"total_s": sum(v for k, v in out.items() if k.endswith("_s"))}


def analyse(raw: dict[str, Any], summary: dict[str, Any] | None, window_steps: int) -> Any:
    windows: list[Window] = raw["windows"]
    wall: dict[str, float] = raw["metadata"].get("wall_time_s") or {}
    events: dict[str, int] = (summary or {}).get("in_flight_events") or {}
    own_s = sum(w["seconds"] for w in windows)
    gaps = uncounted(windows)
    starts = events.get("fresh_starts", 0) + events.get("adds", 0)
    accounted = (
        own_s
        + gaps.get("grid_s", 0.0)
        + wall.get("timing.stop", 0.0)
        + wall.get("timing.settle", 0.0)
    )
    return {
        "windows": len(windows),
        "window_steps": window_steps,
        "timing_s": wall.get("timing"),
        "phases_s": {
            k.removeprefix("timing."): v for k, v in wall.items() if k.startswith("timing.")
        },
        "own_steps": {
            "steps": sum(w["steps"] for w in windows),
            "grid_s": own_s,
            "ms_per_window": 1000 * own_s / len(windows) if windows else None,
        },
        "beyond_window_steps": beyond_window(windows, window_steps),
        "between_windows": gaps,
        "reads": reads(windows, wall, events),
        "k_switches": {
            "count": events.get("k_switches"),
            "ms_per_switch": per_event(wall.get("timing.k_switch"), events.get("k_switches", 0)),
        },
        "starts": {
            "fresh_starts": events.get("fresh_starts"),
            "adds": events.get("adds"),
            "stop_ms_per_fresh_start": per_event(
                wall.get("timing.stop"), events.get("fresh_starts", 0)
            ),
            "settle_ms_per_start": per_event(wall.get("timing.settle"), starts),
            "grid_s": wall.get("timing.stop", 0.0) + wall.get("timing.settle", 0.0),
        },
        "not_accounted_s": None if wall.get("timing") is None else wall["timing"] - accounted,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("raw", type=Path, help="a profile's .raw.json")
    parser.add_argument("--summary", type=Path, help="default: the .summary.json next to it")
    parser.add_argument("--window-steps", type=int, default=InFlightSettings().window_steps)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    raw = json.loads(args.raw.read_text())
    summary_path = args.summary or args.raw.with_name(
        args.raw.name.replace(".raw.json", ".summary.json")
    )
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    analysis = analyse(raw, summary, args.window_steps)
    result = {
        "what": "where an in-flight grid's time went, from its raw windows and summary "
        "(bench/grid_overheads.py); steps between windows estimated from contexts where the "
        "raw file has no per-window engine_steps",
        "command": f"python bench/grid_overheads.py {args.raw}",
        "raw": str(args.raw),
        **analysis,
    }
    if not any(w.get("engine_steps") is not None for w in raw["windows"]):  # measured before
        result["estimated_savings_of_branch_gridfill"] = savings(raw["windows"], analysis)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
