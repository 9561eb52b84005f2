"""bench/gpu/live_step_time.py's pure parts and live_step_time_report.py on synthetic runs."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import sys
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, generate_latest

from tabletune.admin.protocol import StepCellsRead
from tabletune.plugin.metrics_core import TableTuneMetrics
from tabletune.step_cells import CellTotals, cells_from_wire, cells_to_wire

GPU = Path(__file__).resolve().parents[2] / "bench" / "gpu"
RATES = [0.75, 0.55, 0.40]


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, GPU / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the driver imports the report by name, as its folder is on path
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return load("live_step_time_report")


@pytest.fixture(scope="module")
def driver(report: ModuleType) -> ModuleType:
    load("traffic")  # the driver imports it by name too
    return load("live_step_time")


# -- the driver's pure parts ----------------------------------------------------------------------

ENGINE = (("engine", "0"), ("model_name", "qwen3-4b"))


def cell_samples(k: int, batch: str, steps: float, seconds: float, requests: float) -> dict:
    labels = tuple(sorted((*ENGINE, ("k", str(k)), ("batch", batch))))
    return {
        ("tabletune_steps_total", labels): steps,
        ("tabletune_step_seconds_total", labels): seconds,
        ("tabletune_step_seconds_squared_total", labels): seconds * seconds / steps,
        ("tabletune_step_scheduled_tokens_total", labels): requests * (k + 1),
        ("tabletune_step_scheduled_requests_total", labels): requests,
    }


def scrape(cells: list[dict], **vllm: float) -> dict:
    """A parsed /metrics: plugin cells plus vLLM counters (sample name without 'vllm:')."""
    samples: dict = {}
    for cell in cells:
        samples.update(cell)
    samples[("tabletune_steps_without_decode_total", ENGINE)] = vllm.pop("without", 0.0)
    for name, value in vllm.items():
        samples[(f"vllm:{name}", ENGINE)] = value
    return samples


def test_the_driver_reads_the_cells_the_plugin_exports(driver: ModuleType) -> None:
    registry = CollectorRegistry()
    engine = TableTuneMetrics(registry).for_engine(model_name="qwen3-4b", engine="0")
    cells = {(3, 129, 136): CellTotals(10, 0.2, 0.0041, 5200, 1300), (0, 1, 1): CellTotals(2)}
    engine.publish_steps(StepCellsRead(cells, 4.0, 1000.0))
    Counter("vllm:generation_tokens", "g", ["engine"], registry=registry).labels("0").inc(7)
    samples = driver.parse_samples(generate_latest(registry).decode())
    assert driver.cells_from_samples(samples) == (cells, 4.0)
    assert driver.total(samples, "vllm:generation_tokens_total") == 7


def test_a_window_holds_the_increases_of_vllms_counters_and_of_the_cells(
    driver: ModuleType,
) -> None:
    before = scrape([cell_samples(3, "121-128", 100, 1.5, 12_500)], generation_tokens_total=1000)
    after = scrape(
        [
            cell_samples(3, "121-128", 600, 9.5, 75_000),
            cell_samples(2, "121-128", 40, 0.5, 5000),  # new in this window
        ],
        generation_tokens_total=21_000,
        without=3,
    )
    row = driver.window_row({"part": "fixed-k", "arm": "k3"}, before, after, 10.0, [127, 129], None)
    assert row["arm"] == "k3" and row["tokens_per_s"] == 2000 and row["mean_running"] == 128
    cells, without = cells_from_wire(row["cells"])
    assert cells[(3, 121, 128)].steps == 500 and cells[(3, 121, 128)].seconds == 8
    assert cells[(2, 121, 128)].requests == 5000 and without == 3
    assert row["vllm"]["vllm:generation_tokens_total"] == 20_000


def test_a_window_counts_the_steps_at_a_new_k_the_plugin_counts_apart(
    driver: ModuleType,
) -> None:
    registry = CollectorRegistry()
    engine = TableTuneMetrics(registry).for_engine(model_name="qwen3-4b", engine="0")
    cells = {(3, 129, 136): CellTotals(10, 0.2, 0.0041, 5200, 1300)}
    engine.publish_steps(StepCellsRead(cells, 0.0, 1000.0, 4, 0.12))
    before = driver.parse_samples(generate_latest(registry).decode())
    engine.publish_steps(StepCellsRead(cells, 0.0, 1000.0, 10, 0.42))
    after = driver.parse_samples(generate_latest(registry).decode())
    increase = driver.cells_increase(after, before)
    assert increase["switch_steps"] == 6
    assert increase["switch_seconds"] == pytest.approx(0.30)


def test_cells_without_steps_in_the_window_are_left_out(driver: ModuleType) -> None:
    same = scrape([cell_samples(1, "7", 5, 0.05, 35)])
    increase = driver.cells_increase(same, same)
    assert increase["cells"] == [] and increase["steps_without_decode"] == 0.0


def test_the_counters_snapshot_separates_drafting_steps(driver: ModuleType) -> None:
    samples = scrape(
        [cell_samples(3, "121-128", 100, 1.5, 12_500), cell_samples(0, "5", 10, 0.05, 50)],
        without=2,
        iteration_tokens_total_count=112,
    )
    snapshot = driver.counters_snapshot(samples, requests_sent=40)
    assert snapshot["plugin_steps"] == 110 and snapshot["plugin_steps_without_decode"] == 2
    assert snapshot["plugin_requests_in_k_steps"] == 12_500
    assert snapshot["plugin_draft_slots"] == 3 * 12_500
    assert snapshot["vllm"]["vllm:iteration_tokens_total_count"] == 112


def test_a_window_records_when_it_started_and_ended_in_utc_with_milliseconds(
    driver: ModuleType,
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text="vllm:generation_tokens_total 10.0\n")
        return httpx.Response(200, json={"table": [[1, 256, 3]]})

    server = driver.Server("http://stand-in")
    server._http = httpx.AsyncClient(base_url="http://stand-in",
                                     transport=httpx.MockTransport(answer))  # fmt: skip
    row = asyncio.run(server.window({"part": "p", "arm": "k3", "index": 0}, 0.0))
    started, ended = (datetime.fromisoformat(row[key]) for key in ("started_utc", "ended_utc"))
    assert started.utcoffset() == timedelta(0) and started <= ended
    stamps = (row["started_utc"], row["ended_utc"])
    assert all(len(stamp.split(".")[1]) == len("000+00:00") for stamp in stamps)
    assert row["view"] == {"table": [[1, 256, 3]]} and row["arm"] == "k3"


@given(rounds=st.integers(min_value=1, max_value=12))
def test_abba_gives_each_arm_as_many_windows_and_alternates_who_goes_first(
    driver: ModuleType, rounds: int
) -> None:
    arms = driver.abba(("on", "off"), rounds)
    assert len(arms) == 2 * rounds and arms.count("on") == arms.count("off") == rounds
    firsts = arms[::2]
    assert all(a != b for a, b in itertools.pairwise(firsts))
    assert all(arms[i] != arms[i + 1] for i in range(0, len(arms), 2))


# -- the report on a synthetic run ------------------------------------------------------------


def window(part: str, arm: str, tps: float, cells: dict, wall: float = 10.0, **extra: Any) -> dict:
    vllm = {
        "vllm:generation_tokens_total": tps * wall,
        "vllm:spec_decode_num_drafts_total": 1000.0,
        "vllm:spec_decode_num_draft_tokens_total": 1000.0 * (int(arm[1:]) if arm[0] == "k" else 3),
    }
    return {
        "part": part,
        "arm": arm,
        "wall_s": wall,
        "tokens_per_s": tps,
        "mean_running": 128.0,
        "vllm": vllm,
        "cells": cells_to_wire(cells, 0),
        "view": extra.get("view"),
    }


def step_cells(k: int, step_s: float, steps: float = 600, batch: float = 126) -> dict:
    return {(k, 121, 128): CellTotals(steps, steps * step_s, steps * step_s**2, 0, steps * batch)}


def synthetic_run(
    *,
    k2_tps: float = 11_000,
    k3_tps: float = 10_000,
    k2_step_s: float = 0.0235,
    k3_step_s: float = 0.0300,
    on_tps: tuple[float, ...] = (10_010, 9_990, 10_020, 9_980, 10_000),
    off_tps: tuple[float, ...] = (10_000, 10_030, 9_970, 10_000, 10_010),
    counters: bool = True,
) -> dict:
    windows = []
    for arm in ("k2", "k3", "k3", "k2", "k2", "k3", "k3", "k2"):
        tps, step_s = (k2_tps, k2_step_s) if arm == "k2" else (k3_tps, k3_step_s)
        windows.append(window("fixed-k", arm, tps, step_cells(int(arm[1]), step_s)))
    neighbour_cells = {**step_cells(3, 0.030, 600), **step_cells(2, 0.0250, 40)}
    windows.append(window("neighbour", "n16", 9_900, neighbour_cells, view={"neighbour_steps": 41}))
    for tps_on, tps_off in zip(on_tps, off_tps, strict=True):
        windows.append(window("overhead", "on", tps_on, step_cells(3, 0.03)))
        windows.append(window("overhead", "off", tps_off, {}))
    raw: dict = {"meta": {"synthetic_rates": RATES, "device": "test"}, "windows": windows}
    if counters:
        raw["counters"] = {
            "plugin_steps": 99_500.0,
            "plugin_steps_without_decode": 20.0,
            "plugin_requests_in_k_steps": 12_400_000.0,
            "plugin_draft_slots": 34_000_000.0,
            "vllm": {
                "vllm:iteration_tokens_total_count": 99_600.0,
                "vllm:spec_decode_num_drafts_total": 12_380_000.0,
                "vllm:spec_decode_num_draft_tokens_total": 33_950_000.0,
                "vllm:num_preemptions_total": 0.0,
            },
            "requests_sent": 12_000,
            "idle": True,
        }
    return raw


def test_goals_pass_on_a_run_that_meets_them(report: ModuleType) -> None:
    result = report.report(synthetic_run(), "raw.json")
    goals = result["goals"]
    assert goals["counters_agree"]["pass"] is True
    assert goals["counters_agree"]["measured"] == pytest.approx(80 / 99_600)
    assert goals["overhead"]["pass"] is True and goals["overhead"]["measured"] == pytest.approx(
        1 - 10_000 / 10_002
    )
    assert goals["overhead"]["loss_below_same_arm_spread"] is True
    ranking = goals["t_hat_ranks_like_throughput"]
    assert ranking["pass"] is True
    assert ranking["measured"]["throughput_k2_over_k3"] == pytest.approx(1.1)
    # B*tau/T: 126*2.30/0.0235 vs 126*2.70/0.0300
    expected = (2.30 / 0.0235) / (2.70 / 0.0300)
    assert ranking["measured"]["t_hat_k2_over_k3"] == pytest.approx(expected)


def test_the_summary_shows_cells_neighbour_share_and_draft_excess(report: ModuleType) -> None:
    summary = report.summarize(synthetic_run())
    k3 = summary["fixed_k"]["arms"]["k3"]
    assert k3["share_of_decode_steps_at_k"] == 1 and k3["vllm_draft_tokens_per_draft"] == 3
    ((cell,),) = [k3["cells"]]
    assert cell["batch"] == "121-128" and cell["mean_ms"] == pytest.approx(30.0)
    assert k3["step_seconds_per_wall_second"] == pytest.approx(4 * 600 * 0.03 / 40)
    assert summary["fixed_k"]["ranking"]["per_cell"]["share_agreeing"] == 1
    neighbour = summary["neighbour"]
    assert neighbour["share_at_k2"] == pytest.approx(40 / 640) and neighbour["interval"] == 16
    assert neighbour["k2_step_time_vs_fixed_k2_arm"] == pytest.approx(0.025 / 0.0235)
    counters = summary["counters"]
    assert counters["excess_per_request_sent"] == pytest.approx(20_000 / 12_000)


@pytest.mark.parametrize(
    ("change", "goal"),
    [
        ({"k2_step_s": 0.0290}, "t_hat_ranks_like_throughput"),  # T̂ favours k=3, tokens/s k=2
        ({"on_tps": (9_950, 9_960, 9_940, 9_950, 9_950)}, "overhead"),  # 0.52 % lost
    ],
)
def test_a_goal_missed_is_reported_as_failed(report: ModuleType, change: dict, goal: str) -> None:
    goals = report.goals(report.summarize(synthetic_run(**change)))
    assert goals[goal]["pass"] is False
    assert all(g["pass"] is True for name, g in goals.items() if name != goal)


def test_counters_that_disagree_fail(report: ModuleType) -> None:
    raw = synthetic_run()
    raw["counters"]["plugin_steps"] = 90_000.0
    assert report.goals(report.summarize(raw))["counters_agree"]["pass"] is False


def test_a_part_that_did_not_run_has_no_verdict(report: ModuleType) -> None:
    raw = synthetic_run(counters=False)
    raw["windows"] = [w for w in raw["windows"] if w["part"] != "overhead"]
    goals = report.goals(report.summarize(raw))
    assert goals["counters_agree"]["pass"] is None and goals["overhead"]["pass"] is None
    assert goals["t_hat_ranks_like_throughput"]["pass"] is True


def test_main_writes_the_result_and_refuses_other_files(report: ModuleType, tmp_path: Path) -> None:
    raw, out = tmp_path / "raw.json", tmp_path / "out" / "live_step_time_h200.json"
    raw.write_text(json.dumps(synthetic_run()))
    assert report.main([str(raw), "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["source"] == "raw.json" and set(written["goals"]) == {
        "counters_agree",
        "overhead",
        "t_hat_ranks_like_throughput",
    }
    other = tmp_path / "other.json"
    other.write_text('{"checks": []}')
    with pytest.raises(SystemExit, match=r"other\.json"):
        report.main([str(other), "--out", str(tmp_path / "nothing.json")])
    assert not (tmp_path / "nothing.json").exists()
