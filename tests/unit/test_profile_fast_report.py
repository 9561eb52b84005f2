"""bench/gpu/profile_fast_report.py on synthetic runs: table agreement, run-to-run cell ratios,
off-graph cells against their peers, the goals, the PNG."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

GPU = Path(__file__).resolve().parents[2] / "bench" / "gpu"


@pytest.fixture(scope="module")
def report() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "profile_fast_report", GPU / "profile_fast_report.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["profile_fast_report"] = module
    spec.loader.exec_module(module)
    return module


def run_summary(step_ms: dict[str, dict[str, float]], **extra: Any) -> dict[str, Any]:
    return {
        "wall_time_s": {"timing": 95.0, "cross_check": 30.0, "total": 140.0},
        "cells": sum(len(row) for row in step_ms.values()),
        "step_ms": step_ms,
        "remeasured": [[3, 0]],
        "noisy": [],
        "windows_taken_again": 2,
        "context_tokens": 140.0,
        "cuda_graphs": {"max_capture_size": 512, "not_full": {"3,0": "eager", "40,2": "piecewise"}},
        "cross_check": None,
        **extra,
    }


STEPS = {
    "0": {"1": 4.5, "2": 4.6, "3": 25.0, "4": 4.7, "40": 5.0},
    "2": {"1": 4.6, "2": 4.8, "3": 4.9, "4": 5.0, "40": 9.0, "48": 6.0, "32": 5.5},
}
CHECK = {
    "median_difference": -0.012,
    "median_abs_difference": 0.02,
    "cells": [{"batch_size": 1, "k": 0, "in_flight_ms": 4.5, "request_ms": 4.6}],
}


def raw(**changes: Any) -> dict[str, Any]:
    second = {k: {b: ms * 1.02 for b, ms in row.items()} for k, row in STEPS.items()}
    data = {
        "meta": {"startup_s": 120.0, "wall_s": 420.0, "device": "NVIDIA H200", "engine": {}},
        "runs": {
            "run1": run_summary(STEPS, cross_check=CHECK),
            "run2": run_summary(second),
        },
        "tables": {"run1": [[1, 64, 3], [65, 256, 1]], "run2": [[1, 60, 3], [61, 256, 1]]},
        "errors": [],
        "skipped": [],
        "durations_s": {"run1": 200.0, "run2": 100.0},
    }
    data.update(changes)
    return data


def test_tables_agree_where_they_choose_the_same_k(report: ModuleType) -> None:
    agreement = report.table_agreement([[1, 64, 3], [65, 256, 1]], [[1, 60, 3], [61, 256, 1]])
    assert agreement["batch_sizes"] == 256 and agreement["same_k"] == 252
    assert agreement["differ_at"] == [61, 62, 63, 64]
    assert report.table_agreement([[1, 4, 2]], [[1, 4, 2]])["share"] == 1.0


@given(st.lists(st.integers(1, 50), min_size=1, max_size=6), st.integers(0, 3))
def test_a_table_agrees_with_itself_everywhere(
    report: ModuleType, widths: list[int], k: int
) -> None:
    table, start = [], 1
    for i, width in enumerate(widths):
        table.append([start, start + width - 1, (k + i) % 4])
        start += width
    assert report.table_agreement(table, table)["share"] == 1.0


def test_cell_ratios_and_off_graph_cells(report: ModuleType) -> None:
    second = {k: {b: ms * 1.02 for b, ms in row.items()} for k, row in STEPS.items()}
    ratios = report.cell_ratios(STEPS, second)
    assert ratios["cells"] == 12 and ratios["p50"] == pytest.approx(1.02)
    assert ratios["within_10pct"] == 1.0
    cells = report.off_graph_cells(run_summary(STEPS))
    eager = cells[0]
    assert (eager["batch_size"], eager["k"], eager["graph"]) == (3, 0, "eager")
    assert eager["full_graph_peers_ms"] == pytest.approx(4.6)  # B=1, 2, 4 (not 40: too far)
    assert eager["ratio"] == pytest.approx(25.0 / 4.6)
    piecewise = cells[1]
    assert piecewise["full_graph_peers_ms"] == pytest.approx(5.75)  # B=32 and 48


def test_goals_pass_and_fail_on_the_numbers(report: ModuleType) -> None:
    goals = report.goals(report.summarize(raw()))
    assert goals["grid_with_engine_start"]["measured"] == 215.0  # 120 s start + 95 s timing
    assert goals["grid_with_engine_start"]["pass"] is False
    assert goals["grid_with_engine_start"]["engine_start_s"] == 120.0
    assert goals["methods_agree"] == {
        "measured": -0.012,
        "goal": "|median(in-flight / request - 1)| <= 3%",
        "pass": True,
    }
    assert goals["tables_repeat"]["measured"] == pytest.approx(252 / 256)
    assert goals["tables_repeat"]["pass"] is True
    assert goals["job_within_9_minutes"]["pass"] is True
    cold = goals["grid_with_engine_start"]
    assert cold["start"].startswith("cold") and cold["cold_start_s"] == 120.0
    assert cold["with_cold_start_s"] == 215.0


def test_a_warm_start_is_judged_with_the_grid_and_the_cold_one_reported(
    report: ModuleType,
) -> None:
    meta = {"startup_s": 70.0, "warm_start": True, "cold_start_s": 130.0, "wall_s": 400.0}
    goal = report.goals(report.summarize(raw(meta=meta)))["grid_with_engine_start"]
    assert goal["measured"] == 165.0 and goal["pass"] is True  # 70 s warm start + 95 s grid
    assert goal["start"].startswith("warm") and goal["engine_start_s"] == 70.0
    assert goal["cold_start_s"] == 130.0 and goal["with_cold_start_s"] == 225.0
    never = {**meta, "cold_start_s": None}  # the cold launch never answered
    goal = report.goals(report.summarize(raw(meta=never)))["grid_with_engine_start"]
    assert goal["pass"] is True and goal["with_cold_start_s"] is None


def test_a_start_on_a_host_whose_compile_cache_was_filled_is_warm_without_a_cold_start(
    report: ModuleType, tmp_path: Path
) -> None:
    meta = {"startup_s": 51.0, "warm_start": False, "compile_cache_found": True, "wall_s": 380.0}
    goal = report.goals(report.summarize(raw(meta=meta)))["grid_with_engine_start"]
    assert goal["start"].startswith("warm (the host's compile cache")
    assert goal["measured"] == 146.0 and goal["cold_start_s"] is None
    assert goal["with_cold_start_s"] is None
    # JSON from before meta.compile_cache_found: the flag says so; the JSON's own value wins
    source, out = tmp_path / "old.json", tmp_path / "old_h200.json"
    source.write_text(json.dumps(raw(meta={"startup_s": 51.0, "wall_s": 380.0})))
    report.main([str(source), "--out", str(out), "--compile-cache-found"])
    assert json.loads(out.read_text())["goals"]["grid_with_engine_start"]["start"].startswith(
        "warm"
    )
    source.write_text(json.dumps(raw(meta={**meta, "compile_cache_found": False})))
    report.main([str(source), "--out", str(out), "--compile-cache-found"])
    assert json.loads(out.read_text())["goals"]["grid_with_engine_start"]["start"].startswith(
        "cold"
    )


def test_missing_parts_give_no_verdict(report: ModuleType) -> None:
    partial = raw(runs={"run1": run_summary(STEPS)}, tables={})
    goals = report.goals(report.summarize(partial))
    assert goals["methods_agree"]["pass"] is None and goals["tables_repeat"]["pass"] is None
    assert goals["grid_with_engine_start"]["pass"] is False


def test_the_report_writes_its_json_and_png(report: ModuleType, tmp_path: Path) -> None:
    source = tmp_path / "profile_fast.json"
    source.write_text(json.dumps(raw()))
    out = tmp_path / "profile_fast_h200.json"
    assert report.main([str(source), "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["source"] == "profile_fast.json" and written["goals"]["tables_repeat"]["pass"]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    source.write_text(json.dumps({"meta": {}}))
    with pytest.raises(SystemExit, match=r"not written by bench/gpu/profile_fast\.py"):
        report.main([str(source), "--out", str(out)])
