"""The H200 live-daemon report: references, bursts, the daemon part and the replay."""

from __future__ import annotations

import importlib.util
import json
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tabletune.step_cells import CellTotals, cells_to_wire

ROOT = Path(__file__).resolve().parents[2]
START = [[1, 76, 3], [77, 81, 2], [82, 128, 3], [129, 157, 1], [158, 164, 2], [165, 256, 1]]


@pytest.fixture(scope="module")
def report() -> ModuleType:
    path = ROOT / "bench" / "gpu" / "live_daemon_report.py"
    spec = importlib.util.spec_from_file_location("live_daemon_report", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def window(part: str, arm: str, tokens: float, cells: dict[int, tuple[int, float]],
           table: list[list[int]], **extra: Any) -> dict[str, Any]:  # fmt: skip
    """A raw window at B=126 (cell 121-128): k -> (steps, mean ms)."""
    totals = {
        (k, 121, 128): CellTotals(n, n * ms / 1e3, n * (ms / 1e3) ** 2, n * 126 * (k + 1), n * 126)
        for k, (n, ms) in cells.items()
    }
    return {"part": part, "arm": arm, "tokens_per_s": tokens, "wall_s": 10.0,
            "mean_running": 126.0, "cells": cells_to_wire(totals, 0),
            "view": {"table": table}, **extra}  # fmt: skip


def raw_run(daemon_k2_ms: float) -> dict[str, Any]:
    k2, k3 = [[1, 256, 2]], [[1, 256, 3]]
    switched = [[1, 120, 3], [121, 129, 2], [130, 256, 1]]
    windows = [
        window("fixed-k", "k2", 18_000, {2: (600, 16.0)}, k2),
        window("fixed-k", "k3", 14_000, {3: (400, 24.0)}, k3),
        window("bursts", "i32b8", 13_500, {2: (170, 18.0), 3: (590, 26.0)}, k3),
    ]
    for i in range(6):
        table = START if i < 2 else switched
        cells = {3: (380, 24.0), 2: (40, daemon_k2_ms)} if i < 2 else {2: (700, 15.0)}
        tokens = 14_000 if i < 2 else 17_800
        windows.append(window("daemon", "live", tokens, cells, table,
                              since_daemon_start_s=10.0 * (i + 1)))  # fmt: skip
    windows += [
        window("after-daemon", "k2", 18_200, {2: (600, 16.0)}, k2),
        window("after-daemon", "daemon", 17_900, {2: (600, 16.0)}, switched),
        window("after-daemon", "k3", 14_100, {3: (400, 24.0)}, k3),
    ]
    profile = "profiles/h200-qwen3-4b-eagle3.json"
    meta = {
        "synthetic_rates": [0.75, 0.55, 0.40],
        "daemon": {"profile": profile, "start_table": START},
    }
    return {"meta": meta, "windows": windows, "errors": [], "skipped": [],
            "daemon_table": switched}  # fmt: skip


def test_report_separates_learning_from_the_windows_after_the_change(report: ModuleType) -> None:
    result = report.report(raw_run(daemon_k2_ms=15.0))
    assert result["fixed_k"]["k2"]["mean"] == pytest.approx(18_100)
    assert result["bursts"] == {
        "k2_step_ms_in_bursts": pytest.approx(18.0),
        "k2_step_ms_fixed_arms": pytest.approx(16.0),
    }
    daemon = result["daemon"]
    assert daemon["table_changed_in_window_ending_s"] == 30.0
    assert daemon["windows_after_the_change"]["tokens_per_s"] == [17_800] * 3
    assert daemon["loss_after_the_change_vs_best_fixed_k"] == pytest.approx(1 - 17_800 / 18_100)


def test_the_replay_moves_off_k3_only_when_the_recorded_k2_steps_are_faster(
    report: ModuleType,
) -> None:
    fast = report.report(raw_run(daemon_k2_ms=15.0))["replay_at_this_commit"]
    assert fast["load"] == 126
    assert fast["first_switch_off_k3_after_s"] is not None
    slow = report.report(raw_run(daemon_k2_ms=40.0))["replay_at_this_commit"]
    assert all(d["k_at_load"] == 3 for d in slow["decisions"][:2])


def test_the_replay_may_take_every_k_the_engine_captured_not_only_the_daemons_start_tables(
    report: ModuleType,
) -> None:
    # The engine starts on a table of every k (what vLLM captures graphs for, and so what the
    # plugin allows); the daemon then pushes its own start table, which may leave a k out.
    # Allowed from the daemon's table, the replay could never take k=2 at decode-heavy B≈126,
    # where it ran best on the H200 and the live daemon ran it on every step.
    raw = raw_run(daemon_k2_ms=15.0)
    raw["meta"]["daemon"]["start_table"] = [[1, 16, 3], [17, 32, 1], [33, 256, 0]]
    raw["meta"]["starting_table"] = [[1, 1, 0], [2, 2, 1], [3, 3, 2], [4, 256, 3]]
    replayed = report.replay(raw, rates=(0.75, 0.55, 0.40), load=126)
    assert replayed[-1]["k_at_load"] == 2


def test_notable_log_lines_keep_what_the_daemon_did_and_drop_quiet_cycles(
    report: ModuleType,
) -> None:
    import json

    def line(event: str, **fields: Any) -> str:
        return json.dumps({"event": event, **fields})

    quiet = line("cycle done", pushed=[], failed=[], rolled_back=[], forgotten=[], problems={})
    pushed = line("cycle done", pushed=["http://a"], failed=[], rolled_back=[])
    held = line("push held after a rollback", for_s=800)
    lines = [quiet, pushed, quiet, line("table rolled back"), held, quiet, held, held, "Traceback"]
    lines += [quiet, held, line("plugin settings set", neighbour_interval=128)]
    assert report.notable_log_lines(lines) == [
        pushed, line("table rolled back"), held, "Traceback", held,
        line("plugin settings set", neighbour_interval=128),
    ]  # fmt: skip
    assert (
        report.notable_log_lines(lines, limit=2) == lines[-2:]
        and report.notable_log_lines([]) == []
    )


LOG_START = 1.8e9  # when the daemon part started


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def _daemon_part(events: list[dict[str, Any]], **settings: str) -> dict[str, Any]:
    """A raw run whose daemon part started at START, with these log events (``at``: seconds
    since its start)."""
    windows = [{"part": "decode-heavy-B256-daemon", "since_daemon_start_s": 2.0,
                "started_utc": _utc(LOG_START + 2.0)}]  # fmt: skip
    lines = [json.dumps({**{k: v for k, v in e.items() if k != "at"},
                         "timestamp": _utc(LOG_START + e["at"]).replace("+00:00", "Z")})
             for e in events]  # fmt: skip
    return {
        "meta": {"daemon": {"settings_from_env": settings}},
        "windows": windows,
        "daemon_log_events": {"decode-heavy-B256-daemon": lines},
    }


ROLLBACK = {"event": "alert event", "alertname": "TableTuneRollback"}


def test_a_rollback_holds_pushes_for_the_cooldown_or_until_a_shift_ends_it(
    report: ModuleType,
) -> None:
    part = "decode-heavy-B256-daemon"
    alone = _daemon_part([{**ROLLBACK, "at": 140.6}])
    assert report.rollback_holds(alone, part) == [(140.6, 1040.6)]  # the default 900 s
    short = _daemon_part([{**ROLLBACK, "at": 40.0}], TABLETUNE_GUARD__COOLDOWN_S="60")
    assert report.rollback_holds(short, part) == [(40.0, 100.0)]
    shifted = _daemon_part([
        {**ROLLBACK, "at": 40.0}, {"event": "rollback hold ended: the traffic shifted", "at": 75.5},
    ])  # fmt: skip
    assert report.rollback_holds(shifted, part) == [(40.0, 75.5)]


def test_a_hold_is_read_from_the_held_pushes_where_the_log_lost_the_rollback(
    report: ModuleType,
) -> None:
    # An older launch kept only the log's tail: "push held" 801 s before the hold ends.
    part = "decode-heavy-B256-daemon"
    held = _daemon_part([{"event": "push held after a rollback", "for_s": 801, "at": 147.0}])
    assert report.rollback_holds(held, part) == [(48.0, 948.0)]
    again = {"event": "push held after a rollback", "for_s": 801, "at": 147.0}
    both = _daemon_part([{**ROLLBACK, "at": 47.6}, again])
    assert report.rollback_holds(both, part) == [(47.6, 947.6)]  # one rollback, not two
    assert report.rollback_holds(_daemon_part([]), part) == []


@pytest.mark.parametrize(
    ("span", "held"),
    [((141.4, 200.3), 58.9), ((2.0, 30.0), 0.0), ((100.0, 150.0), 9.4), ((2.0, 2000.0), 900.0)],
)
def test_the_seconds_of_a_reading_inside_a_hold(
    report: ModuleType, span: tuple[float, float], held: float
) -> None:
    assert report.overlap_s(span, [(140.6, 1040.6)]) == pytest.approx(held)
