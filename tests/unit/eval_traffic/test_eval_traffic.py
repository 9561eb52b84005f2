"""bench/gpu/eval_traffic.py's pure parts, its report on synthetic runs, and
capture_size_report.py on synthetic profiles."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import statistics
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.step_cells import CellTotals, cells_to_wire
from tests.support.gpu_jobs import ROOT, eval_traffic_driver, load_gpu_module

ARMS = ["k0", "k1", "k2", "k3", "documented", "measured", "daemon"]


@given(arms=st.lists(st.sampled_from(ARMS), min_size=1, max_size=7, unique=True),
       pairs=st.integers(1, 4))  # fmt: skip
def test_rotations_give_every_arm_every_round_and_the_same_mean_place(
    driver: ModuleType, arms: list[str], pairs: int
) -> None:
    order = driver.rotations(arms, 2 * pairs)
    assert len(order) == 2 * pairs * len(arms)
    rounds = [order[i : i + len(arms)] for i in range(0, len(order), len(arms))]
    assert all(sorted(r) == sorted(arms) for r in rounds)
    places = {arm: [r.index(arm) for r in rounds] for arm in arms}
    means = {statistics.fmean(p) for p in places.values()}
    assert max(means) - min(means) < 1e-9  # a drift in the machine favours no arm


@given(arms=st.lists(st.sampled_from(ARMS), min_size=2, max_size=7, unique=True))
def test_over_a_cycle_of_pairs_every_arm_follows_every_other_equally_often(
    driver: ModuleType, arms: list[str]
) -> None:
    """A window carries some of the arm before it (the closed loop's requests settle into a
    new k's mix over seconds): over len(arms) pairs of rounds each arm comes right after each
    other arm within a round exactly twice, so no arm gains from its neighbours (a plain
    rotation put each arm only ever after the two beside it in the list)."""
    n = len(arms)
    order = driver.rotations(arms, 2 * n)
    rounds = [order[i : i + n] for i in range(0, len(order), n)]
    follows = Counter((r[j - 1], r[j]) for r in rounds for j in range(1, n))
    assert set(follows) == {(a, b) for a in arms for b in arms if a != b}
    assert set(follows.values()) == {2}


def test_the_documented_table_is_cut_at_max_num_seqs(driver: ModuleType) -> None:
    assert driver.documented_table(256) == [[1, 64, 3], [65, 128, 1], [129, 256, 0]]
    assert driver.documented_table(100) == [[1, 64, 3], [65, 100, 1]]


def test_loads_name_their_shape_or_take_the_runs(driver: ModuleType) -> None:
    assert driver.parse_loads("128,decode-heavy:192", "chat-like") == [
        ("chat-like", 128),
        ("decode-heavy", 192),
    ]
    assert driver.parse_loads("none", "chat-like") == []  # the shape change alone
    for bad in ("", "0", "x", "nope:12", "chat-like:", "12,,3"):
        with pytest.raises(ValueError, match="N or SHAPE:N"):
            driver.parse_loads(bad, "chat-like")


def test_the_measured_table_is_read_from_the_profilers_table_file(
    driver: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"ranges": [[1, 100, 3], [101, 256, 1]]}))
    assert driver.read_table(str(path)) == [[1, 100, 3], [101, 256, 1]]


# -- the report -------------------------------------------------------------------------------


def window(part: str, arm: str, tokens_per_s: float, k: int, running: float = 190.0) -> dict:
    cells = {(k, 185, 192): CellTotals(100.0, 3.0, 0.1, 100.0 * 190 * (k + 1), 100.0 * 190)}
    return {
        "part": part,
        "arm": arm,
        "tokens_per_s": tokens_per_s,
        "mean_running": running,
        "wall_s": 6.0,
        "cells": cells_to_wire(cells, 0.0),
        "view": {"table": [[1, 256, k]]},
    }


def raw_run(rows: list[dict[str, Any]], loads: list[Any]) -> dict[str, Any]:
    """A run's JSON; each row's index is its place in its part, as the driver numbers them."""
    places: dict[str, int] = {}
    for row in rows:
        row.setdefault("index", places.get(row["part"], 0))
        places[row["part"]] = row["index"] + 1
    return {
        "meta": {
            "shape": "chat-like",
            "loads": loads,
            "synthetic_rates": [0.75, 0.55, 0.40],
            "daemon": {
                "profile": "profiles/h200-qwen3-4b-eagle3-inflight.json",
                "start_table": [[1, 16, 3], [17, 32, 1], [33, 256, 0]],
            },
        },
        "windows": rows,
        "daemon_tables": {},
        "errors": [],
        "skipped": [],
        "durations_s": {},
    }


def test_losses_count_only_beyond_the_spread_and_same_k_arms_are_grouped(
    report: ModuleType,
) -> None:
    part = "chat-like-B192"
    rows = [
        window(f"{part}-daemon", "live", 9000.0, 1),
        window(f"{part}-arms", "k1", 10000.0, 1),
        window(f"{part}-arms", "k1", 10400.0, 1),
        window(f"{part}-arms", "k3", 12000.0, 3),
        window(f"{part}-arms", "k3", 12100.0, 3),
        window(f"{part}-arms", "daemon", 11900.0, 3),
        window(f"{part}-arms", "daemon", 12000.0, 3),
    ]
    loads = [{"part": part, "shape": "chat-like", "clients": 192}]
    result = report.report(raw_run(rows, loads))
    load = result["loads"][part]
    assert load["best_fixed_k"] == "k3" and load["effective_batch"] == 190.0
    k1, daemon = load["arms"]["k1"], load["arms"]["daemon"]
    assert k1["loss_vs_best_fixed_k"] == pytest.approx(1 - 10200 / 12050, abs=1e-4)
    assert k1["loss_is_a_result"] is True  # 15 % against spreads of 4 % and 0.8 %
    assert daemon["loss_is_a_result"] is False  # 0.8 % inside the daemon's own 0.8 % spread
    assert load["k_mix"]["daemon"] == {3: 1.0}
    assert load["arms_running_one_and_the_same_k"]["k3"]["arms"] == ["k3", "daemon"]
    goal = result["goals"]["daemon_worst_load_loss_chat_like"]
    assert goal["pass"] is True and goal["judgeable"] is True
    assert result["goals"]["shape_change"]["pass"] is None


def test_pairing_windows_of_one_round_cancels_a_slow_drift(report: ModuleType) -> None:
    """The machine drifts by up to 20 % between rounds; the daemon runs 2 % below k3 in every
    round: too small against the unpaired spread, a result against the paired one."""
    part = "chat-like-B192"
    rows = []
    for r, drift in enumerate((1.0, 1.2, 0.85, 1.1, 0.95, 1.15)):
        order = [("k1", 9000.0, 1), ("k3", 12000.0, 3), ("daemon", 11760.0, 3)]
        for arm, tps, k in order if r % 2 == 0 else order[::-1]:
            rows.append(window(f"{part}-arms", arm, tps * drift, k))
    loads = [{"part": part, "shape": "chat-like", "clients": 192}]
    load = report.report(raw_run(rows, loads))["loads"][part]
    daemon = load["arms"]["daemon"]
    assert daemon["loss_is_a_result"] is False  # 2 % inside the unpaired spread of ~35 %
    assert daemon["paired"]["ratios"] == [0.98] * 6
    assert daemon["paired"]["loss_vs_best_fixed_k"] == pytest.approx(0.02)
    assert daemon["paired"]["spread_of_ratios"] == pytest.approx(0.0)
    assert daemon["loss_is_a_result_paired"] is True
    assert load["arms"]["k3"]["loss_is_a_result_paired"] is False  # the best against itself
    null = load["arms_running_one_and_the_same_k"]["k3"]["paired_against_the_first"]["daemon"]
    assert null["median_ratio"] == pytest.approx(0.98) and null["spread_of_ratios"] == 0.0
    goal = report.report(raw_run(rows, loads))["goals"]["daemon_worst_load_loss_chat_like"]
    assert goal["judgeable"] is False and goal["paired"]["judgeable"] is True
    assert goal["paired"]["measured"] == pytest.approx(0.02) and goal["paired"]["pass"] is True
    assert goal["paired"]["largest_same_k_paired_difference"] == pytest.approx(0.02)
    assert load["rounds"] == {"planned": None, "run": 6}


def test_runs_that_named_loads_by_clients_alone_still_report(report: ModuleType) -> None:
    rows = [window("B64-arms", "k2", 5000.0, 2), window("B64-arms", "k3", 4000.0, 3)]
    result = report.report(raw_run(rows, [64, 128]))
    assert result["loads"]["B64"]["best_fixed_k"] == "k2"
    assert result["loads"]["B128"] is None  # skipped in that run
    assert result["goals"]["daemon_worst_load_loss_chat_like"]["measured"] is None


def test_the_nightjar_arm_is_judged_against_three_times_the_daemons_worst_loss(
    report: ModuleType,
) -> None:
    rows = []
    for part, nightjar in (("chat-like-B64", 11000.0), ("chat-like-B192", 10800.0)):
        rows += [
            window(f"{part}-arms", "k3", 12000.0, 3),
            window(f"{part}-arms", "k3", 12060.0, 3),
            window(f"{part}-arms", "daemon", 11880.0, 3),  # about 1 % below k3
            window(f"{part}-arms", "daemon", 11900.0, 3),
            window(f"{part}-arms", "nightjar", nightjar, 1),
            window(f"{part}-arms", "nightjar", nightjar + 40, 1),
        ]
    loads = [{"part": p, "shape": "chat-like", "clients": c} for p, c in
             (("chat-like-B64", 64), ("chat-like-B192", 192))]  # fmt: skip
    result = report.report(raw_run(rows, loads))
    goal = result["goals"]["nightjar_style_loss_3x_daemon"]
    worst_daemon = max(result["loads"][p]["arms"]["daemon"]["loss_vs_best_fixed_k"] for p in
                       ("chat-like-B64", "chat-like-B192"))  # fmt: skip
    assert goal["measured"]["nightjar_worst_load_loss"] == pytest.approx(1 - 10820 / 12030, 1e-3)
    assert goal["measured"]["daemon_worst_load_loss"] == worst_daemon
    assert goal["measured"]["ratio"] == pytest.approx((1 - 10820 / 12030) / worst_daemon, 1e-2)
    assert goal["pass"] is True and goal["judgeable"] is True
    # A bandit as good as the daemon fails the goal.
    close = [dict(w, tokens_per_s=11890.0) if w["arm"] == "nightjar" else w for w in rows]
    assert (
        report.report(raw_run(close, loads))["goals"]["nightjar_style_loss_3x_daemon"]["pass"]
        is False
    )


def test_without_the_nightjar_arm_its_goal_is_not_run(report: ModuleType) -> None:
    rows = [window("B64-arms", "k2", 5000.0, 2), window("B64-arms", "daemon", 4900.0, 2)]
    goal = report.report(raw_run(rows, [64]))["goals"]["nightjar_style_loss_3x_daemon"]
    assert goal["pass"] is None and goal["measured"] is None and "--arms" in goal["note"]


# -- the capture-size comparison ---------------------------------------------------------------


def profile(cells: dict[tuple[int, int], tuple[float, str]]) -> dict:
    return {
        "cells": [
            {
                "batch_size": b,
                "k": k,
                "step_ms": ms,
                "samples_ms": [ms * 0.99, ms, ms * 1.01],
                "cuda_graph": graph,
            }
            for (b, k), (ms, graph) in cells.items()
        ]
    }


def job(limit: int, capture_s: float, gib: float) -> dict:
    engine = {"max_capture_size": limit, "capture_s": capture_s, "capture_gib": gib,
              "gpu_memory_used_mib": 130000}  # fmt: skip
    meta = {"device": "H200", "engine_version": "0.26.0", "date": "d", "commit": "c"}
    return {"meta": meta, "summary": {"engine": engine, "startup_s": 100.0}}


def test_raising_the_limit_is_recommended_when_the_cells_past_it_get_faster() -> None:
    compare = load_gpu_module("capture_size_report").compare
    default = profile(
        {(128, 3): (10.0, "full"), (144, 3): (26.0, "eager"), (176, 2): (28.0, "eager")}
    )
    raised = profile({(128, 3): (10.2, "full"), (144, 3): (12.0, "full"), (176, 2): (12.5, "full")})
    result = compare(default, job(512, 11.0, 1.4), raised, job(1024, 15.0, 2.31))
    past = result["past_the_default_limit"]
    assert past["cells"] == 2 and past["faster_beyond_noise"] == 2
    assert result["within_the_default_limit"]["cells"] == 1
    assert result["recommendation"].startswith("raise max_cudagraph_capture_size to 1024")
    assert result["cost"]["graph_gib"] == [1.4, 2.31]
    same = compare(default, job(512, 11.0, 1.4), default, job(1024, 15.0, 2.31))
    assert same["recommendation"].startswith("keep the default")


def test_a_shape_change_names_two_shapes_and_a_load(driver: ModuleType) -> None:
    assert driver.parse_change("decode-heavy:chat-like:192") == ("decode-heavy", "chat-like", 192)
    for bad in ("decode-heavy:chat-like", "chat-like:chat-like:8", "x:chat-like:8",
                "decode-heavy:chat-like:0", "decode-heavy:chat-like:n"):  # fmt: skip
        with pytest.raises(ValueError, match="BEFORE:AFTER:N"):
            driver.parse_change(bad)


def with_k_mix(
    row: dict[str, Any], steps: dict[int, float], step_s: dict[int, float] | None = None
) -> dict[str, Any]:
    """``row`` with its step cells at several k (``steps``: steps per k at B=185-192, each
    ``step_s`` long, 30 ms unless given)."""
    long = step_s or {}
    cells = {(k, 185, 192): CellTotals(n, long.get(k, 0.03) * n, 0.001 * n, n * 190 * (k + 1),
                                       n * 190)
             for k, n in steps.items()}  # fmt: skip
    return {**row, "cells": cells_to_wire(cells, 0.0)}


CHANGE = "change-decode-heavy-chat-like-B192"
OLD, NEW = [[1, 256, 1]], [[1, 256, 3]]


def live(since: float, tps: float, table: list[list[int]],
         mix: dict[int, float] | None = None) -> dict[str, Any]:  # fmt: skip
    """A window of the daemon in the shape change's part (its steps at k1 unless ``mix``)."""
    row = window(f"{CHANGE}-daemon", "live", tps, 1)
    row = with_k_mix(row, mix) if mix else row
    return {**row, "since_daemon_start_s": since, "view": {"table": table}}


def change_run(daemon_windows: list[dict[str, Any]]) -> dict[str, Any]:
    """A change of traffic at 36 s under the daemon (its ``daemon_windows``); then, on the new
    traffic, k1 (the table at the change) 20 % below k3 (the daemon's last)."""
    rows = [
        *daemon_windows,
        window(f"{CHANGE}-arms", "k1", 8000.0, 1),
        window(f"{CHANGE}-arms", "k3", 10000.0, 3),
        window(f"{CHANGE}-arms", "before", 8000.0, 1),
        window(f"{CHANGE}-arms", "after", 10000.0, 3),
    ]
    raw = raw_run(rows, [])
    raw["shape_change"] = {"part": CHANGE, "at_s": 36.0, "table_at_change": OLD}
    return raw


def test_the_shape_change_report_times_the_new_table_and_the_gap(report: ModuleType) -> None:
    raw = change_run([
        live(30.0, 10000.0, OLD),  # before the change (at 36 s)
        live(46.0, 8000.0, OLD),
        live(66.0, 9000.0, NEW),  # in force by 30 s after the change
        live(96.0, 9900.0, NEW),
        live(126.0, 10000.0, NEW),
    ])  # fmt: skip
    result = report.report(raw)
    change = result["shape_change"]
    assert change["new_table_in_force_by_s"] == 30.0
    assert change["share_of_gap_recovered"] == {"30s": 0.5, "60s": 0.95, "90s": 1.0}
    assert result["goals"]["shape_change"]["pass"] is True


def test_the_shape_change_gap_is_also_read_from_the_k_the_daemons_steps_ran(
    report: ModuleType,
) -> None:
    """Single windows scatter; the k mix does not: k1 is 20 % below k3 on the new traffic, the
    daemon's window 30 s after the change runs k3 on 90 % of its steps: 90 % of the gap."""
    raw = change_run([
        live(46.0, 8000.0, OLD, {1: 100.0}),
        live(66.0, 7000.0, NEW, {3: 90.0, 1: 10.0}),  # a slow window, yet the right k
        live(96.0, 12000.0, NEW, {3: 100.0}),
        live(126.0, 7000.0, NEW, {3: 100.0}),
    ])  # fmt: skip
    result = report.report(raw)
    change = result["shape_change"]
    assert change["loss_from_k_mix_of_the_table_at_the_change"] == 0.2
    assert [w["loss_from_k_mix"] for w in change["windows_after_the_change"]] == [
        0.2, 0.02, 0.0, 0.0]  # fmt: skip
    assert change["share_of_gap_recovered_by_k_mix"] == {"30s": 0.9, "60s": 1.0, "90s": 1.0}
    assert change["share_of_gap_recovered"]["90s"] == -0.5  # the last window alone: slow
    goal = result["goals"]["shape_change"]
    assert goal["pass"] is False and goal["by_k_mix"]["pass"] is True


def test_the_shape_change_gap_is_also_read_from_the_table_in_force_at_each_mark(
    report: ModuleType,
) -> None:
    """The daemon's own table is what the loads are judged on (its arm, exploring off); a
    window's steps also carry its bursts. Here the right table is in force from 30 s and the
    window at 90 s burst k0, which no arm ran (priced lost whole): by k mix 50 % of the gap,
    by the table in force, priced on the new traffic's batch cells, all of it. A table that
    puts k1 back where the batch sits gives the gap back whatever its other cells say."""
    rare = [[1, 100, 1], [101, 256, 3]]  # k1 only below 101, where the traffic never was
    raw = change_run([
        live(46.0, 8000.0, OLD, {1: 100.0}),
        live(66.0, 9000.0, rare, {3: 100.0}),
        live(96.0, 9500.0, NEW, {3: 90.0, 0: 10.0}),
        live(126.0, 9500.0, NEW, {3: 90.0, 0: 10.0}),
    ])  # fmt: skip
    change = report.report(raw)["shape_change"]
    assert change["loss_from_table_at_the_change"] == 0.2
    assert [w["loss_from_table"] for w in change["windows_after_the_change"]] == [
        0.2, 0.0, 0.0, 0.0]  # fmt: skip
    assert change["share_of_gap_recovered_by_table"] == {"30s": 1.0, "60s": 1.0, "90s": 1.0}
    assert change["share_of_gap_recovered_by_k_mix"]["90s"] == 0.5
    goal = report.report(raw)["goals"]["shape_change"]
    assert goal["by_table"]["pass"] is True and goal["by_k_mix"]["pass"] is False

    back = change_run([live(46.0, 8000.0, OLD), live(126.0, 9500.0, [[1, 256, 1]])])
    assert report.report(back)["shape_change"]["share_of_gap_recovered_by_table"]["90s"] == 0.0


def test_a_shape_change_is_drawn_even_in_a_launch_of_no_other_load(
    report: ModuleType, tmp_path: Path
) -> None:
    """The change's own panel (its losses after the change against the gap) is the figure of a
    launch that ran the change alone; a launch with neither draws nothing."""
    pytest.importorskip("matplotlib")
    raw = change_run([live(46.0, 8000.0, OLD, {1: 100.0}), live(66.0, 9000.0, NEW, {3: 100.0})])
    drawn = tmp_path / "change.png"
    report.plot(report.report(raw), drawn)
    assert drawn.read_bytes().startswith(b"\x89PNG")

    nothing = tmp_path / "nothing.png"
    report.plot(report.report(raw_run([], [])), nothing)
    assert not nothing.exists()


def test_a_bad_measured_table_file_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "t.json"
    bad.write_text('{"x": 1}')
    done = subprocess.run(
        [
            sys.executable,
            "bench/gpu/eval_traffic.py",
            "--out",
            str(tmp_path / "o.json"),
            "--measured-table",
            str(bad),
        ],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": "src", "PATH": ""},
        cwd=ROOT,
    )
    assert done.returncode == 2 and "--measured-table" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "o.json").exists()


# -- fitting the budget -------------------------------------------------------------------------


@given(planned=st.integers(1, 40), per_round=st.floats(1, 100), fixed=st.floats(0, 200),
       left=st.floats(0, 5000))  # fmt: skip
def test_a_load_runs_its_plan_or_the_most_whole_pairs_that_fit(
    driver: ModuleType, planned: int, per_round: float, fixed: float, left: float
) -> None:
    def needs(rounds: int) -> float:
        return fixed + per_round * rounds

    rounds = driver.rounds_that_fit(planned, needs, left)
    if needs(planned) <= left:
        assert rounds == planned
    elif needs(2) > left or planned <= 2:
        assert rounds == 0  # not even one pair (or the plan itself was at most one pair)
    else:
        assert rounds % 2 == 0 and 2 <= rounds < planned and needs(rounds) <= left
        assert needs(rounds + 2) > left or rounds + 2 >= planned  # no larger pair fits


RAW = ROOT / "bench" / "results" / "gpu_raw"
CHAT_B192_12S = RAW / "eval_traffic_chat_like_b192_12s_h200_20261130T2359Z.json"


def run_of(driver: ModuleType, meta: dict[str, Any]) -> Any:
    args = argparse.Namespace(
        base="http://stand-in", budget_s=500, shape=meta["shape"], arms=",".join(meta["arms"]),
        rounds=meta["rounds"], rounds_per_block=meta.get("rounds_per_block", 1),
        window_s=meta["window_s"], settle_s=meta["settle_s"],
        warmup_s=6.0, daemon_s=meta["daemon"]["run_s"],
        nightjar_learn_s=meta["nightjar"]["learn_s"],
        nightjar_s=meta["nightjar"].get("run_s") or 24.0,
    )  # fmt: skip
    return driver.Run(args, {})


def test_the_time_estimate_covers_the_recorded_launch_closely(driver: ModuleType) -> None:
    """The H200 launch of 2026-11-30 (chat-like B=192, 5 arms, 12 s windows, 4 rounds) took
    378.8 s; the old estimate said 405 s and the next launches skipped the load for it."""
    raw = json.loads(CHAT_B192_12S.read_text())
    needed = run_of(driver, raw["meta"]).load_needs_s(raw["meta"]["rounds"])
    took = raw["durations_s"]["chat-like-B192"]
    assert took <= needed <= 1.05 * took


@pytest.mark.parametrize(
    "stamp",
    [
        "chat_like_b192_blocks_h200_20261201T0514Z",
        "decode_heavy_b192_blocks_h200_20261201T0523Z",
        "moe_chat_like_b192_blocks_h200_20261201T0531Z",
    ],
)
def test_the_time_estimate_covers_the_launches_of_one_second_visits(
    driver: ModuleType, stamp: str
) -> None:
    """The three block launches of 2026-12-01 (4 arms, 1 s visits): never under what they
    took (a load that overran would cut the launch), at most 10 % over (rounds lost)."""
    raw = json.loads((RAW / f"eval_traffic_{stamp}.json").read_text())
    ((part, ran),) = raw["rounds"].items()
    needed = run_of(driver, raw["meta"]).load_needs_s(ran["run"])
    took = raw["durations_s"][part]
    assert took <= needed <= 1.10 * took


def test_in_blocks_the_bandit_costs_one_run_a_load_not_a_learning_a_round(
    driver: ModuleType,
) -> None:
    meta = {"shape": "chat-like", "arms": ["k1", "k3", "daemon", "nightjar"], "rounds": 8,
            "rounds_per_block": 4, "window_s": 1.0, "settle_s": 0.25,
            "daemon": {"run_s": 36.0}, "nightjar": {"learn_s": 12.0, "run_s": 24.0}}  # fmt: skip
    with_bandit = run_of(driver, meta).load_needs_s(8)
    without = run_of(driver, {**meta, "arms": ["k1", "k3", "daemon"]}).load_needs_s(8)
    windows = 24 * (1.0 + driver.WINDOW_OVERHEAD_S)
    assert with_bandit - without == pytest.approx(12.0 + 0.25 + windows)
    rounds = run_of(driver, {**meta, "rounds_per_block": 1}).load_needs_s(8)
    assert rounds - without > 8 * 12.0  # without blocks: a fresh learning every round


def test_a_load_that_does_not_fit_runs_fewer_pairs_and_records_it(driver: ModuleType) -> None:
    raw = json.loads(CHAT_B192_12S.read_text())
    live = run_of(driver, raw["meta"])
    live.deadline = time.monotonic() + 374.7  # what was left in the lost launch
    ran: list[int] = []

    async def body(rounds: int) -> None:
        ran.append(rounds)

    live.result = {"skipped": [], "durations_s": {}, "errors": []}
    live.save = lambda: None
    asyncio.run(live.fitted_part("chat-like-B192", live.load_needs_s, body))
    assert ran == [2] and live.result["rounds"]["chat-like-B192"] == {"planned": 4, "run": 2}
    live.deadline = time.monotonic() + 100  # not even one pair
    asyncio.run(live.fitted_part("chat-like-B64", live.load_needs_s, body))
    assert ran == [2] and live.result["rounds"]["chat-like-B64"] == {"planned": 4, "run": 0}
    assert live.result["skipped"][0]["part"] == "chat-like-B64"


def test_a_load_leaves_room_for_the_shape_change_it_is_told_to(driver: ModuleType) -> None:
    raw = json.loads(CHAT_B192_12S.read_text())
    live = run_of(driver, raw["meta"])
    ran: list[int] = []

    async def body(rounds: int) -> None:
        ran.append(rounds)

    live.result = {"skipped": [], "durations_s": {}, "errors": []}
    live.save = lambda: None
    live.deadline = time.monotonic() + 374.7
    reserve = 374.7 - live.load_needs_s(2) + 1.0  # one pair no longer fits beside it
    asyncio.run(live.fitted_part("chat-like-B192", live.load_needs_s, body, reserve_s=reserve))
    assert ran == [] and live.result["rounds"]["chat-like-B192"]["run"] == 0
    live.deadline = time.monotonic() + 374.7
    reserve = 374.7 - live.load_needs_s(2) - 1.0
    asyncio.run(live.fitted_part("chat-like-B64", live.load_needs_s, body, reserve_s=reserve))
    assert ran == [2]


# -- stalls: windows where the GPU waited on the host -------------------------------------------


def test_a_windows_engine_figures_come_from_its_raw_row(report: ModuleType) -> None:
    row = {**window("B192-arms", "k3", 12000.0, 3), "wall_s": 4.0}  # 100 steps in 3 s
    row["vllm"] = {"vllm:iteration_tokens_total_count": 104.0,
                   "vllm:prompt_tokens_total": 120000.0}  # fmt: skip
    assert report.window_engine(row) == {"steps": 104.0, "mean_step_ms": 30.0,
                                         "prompt_tokens_per_s": 30000.0,
                                         "mean_running": 190.0}  # fmt: skip
    bare = {**row, "vllm": {}, "cells": cells_to_wire({}, 0.0)}
    assert report.window_engine(bare) == {"steps": None, "mean_step_ms": None,
                                          "prompt_tokens_per_s": None,
                                          "mean_running": 190.0}  # fmt: skip


def test_pearson_r_on_known_data(report: ModuleType) -> None:
    assert report.pearson([(1, 2), (2, 4), (3, 6)]) == {"r": 1.0, "n": 3}
    assert report.pearson([(1, 3), (2, 2), (None, 9), (3, 1), (4, None)]) == {"r": -1.0, "n": 3}
    # x 1..5, y 2 4 5 4 5: sum dx*dy 6, sum dx^2 10, sum dy^2 6: r = 6 / sqrt(60)
    assert report.pearson([(1, 2), (2, 4), (3, 5), (4, 4), (5, 5)]) == {"r": 0.775, "n": 5}
    assert report.pearson([(1, 0.0), (2, 0.0), (3, 0.0)]) == {"r": None, "n": 3}  # constant
    assert report.pearson([(1, 2), (2, 3)]) == {"r": None, "n": 2}  # too few


def stall_run(with_host: bool) -> tuple[dict[str, Any], str]:
    """8 windows at B=192; the GPU busy 55-100 %; tokens/s 100x the GPU's busy share, the mean
    step (ms) 100 - util / 2, the engine core's run-queue wait (util - 100) / -1000, its CPU
    and the steal flat."""
    part = "chat-like-B192"
    utils = [95.0, 60.0, 98.0, 70.0, 97.0, 100.0, 55.0, 90.0]
    rows = []
    for i, util in enumerate(utils):
        arm, k = ("k1", 1) if i % 2 == 0 else ("k3", 3)
        row = window(f"{part}-arms", arm, 100.0 * util, k)
        steps, step_s = 100.0, (100.0 - util / 2) / 1000
        row["cells"] = cells_to_wire(
            {(k, 185, 192): CellTotals(steps, steps * step_s, 0.0, steps * 190 * (k + 1),
                                       steps * 190)}, 0.0)  # fmt: skip
        row["wall_s"] = 4.0
        row["vllm"] = {"vllm:iteration_tokens_total_count": 4000 / (100 - util / 2),
                       "vllm:prompt_tokens_total": 1000.0 * util}  # fmt: skip
        row["gpu"] = {"samples": 4, "utilization_pct": util}
        if with_host:
            row["host"] = {
                "samples": 3, "busy_share": 0.12, "iowait_share": 0.0, "steal_share": 0.0,
                "engine_core_cpu": 1.02, "engine_core_runqueue_wait": (100.0 - util) / 1000,
                "engine_core_voluntary_per_s": 2.0, "engine_core_involuntary_per_s": 20.0,
                "api_server_cpu": 0.6,
            }  # fmt: skip
        rows.append(row)
    return raw_run(rows, [{"part": part, "shape": "chat-like", "clients": 192}]), part


def test_stalls_are_counted_by_arm_and_tokens_per_s_correlated_with_their_signs(
    report: ModuleType,
) -> None:
    raw, part = stall_run(with_host=True)
    stalls = report.report(raw)["loads"][part]["stalls"]
    assert (stalls["gpu_busy_below_pct"], stalls["windows"], stalls["of_windows"]) == (80, 3, 8)
    assert stalls["by_arm"] == {"k3": 2, "k1": 1} and stalls["indices"] == [1, 3, 6]
    r = stalls["pearson_r_of_tokens_per_s_with"]
    assert r["gpu_utilization_pct"] == {"r": 1.0, "n": 8}
    assert r["mean_step_ms"] == {"r": -1.0, "n": 8}
    assert r["engine_core_runqueue_wait"] == {"r": -1.0, "n": 8}
    assert r["engine_core_cpu"] == {"r": None, "n": 8}  # flat: no correlation to give
    assert r["host_steal_share"] == {"r": None, "n": 8}
    means = stalls["stalled_vs_other"]
    assert means["gpu_utilization_pct"] == {"stalled": 61.7, "other": 96.0}
    assert means["mean_step_ms"] == {"stalled": 69.2, "other": 52.0}
    assert means["engine_core_cpu"] == {"stalled": 1.02, "other": 1.02}
    assert "note" not in stalls
    line = report.report(raw)["loads"][part]["windows"][1]
    assert line["engine"]["mean_step_ms"] == 70.0 and line["host"]["engine_core_cpu"] == 1.02


def test_a_run_without_host_or_gpu_log_still_reports_its_stalls_as_unknown(
    report: ModuleType,
) -> None:
    raw, part = stall_run(with_host=False)
    result = report.report(raw)
    stalls = result["loads"][part]["stalls"]
    r = stalls["pearson_r_of_tokens_per_s_with"]
    assert r["gpu_utilization_pct"] == {"r": 1.0, "n": 8}
    assert r["engine_core_cpu"] is None and r["host_steal_share"] is None
    assert "no host log" in stalls["note"] and "engine_core_cpu" not in stalls["stalled_vs_other"]
    assert result["host_load"] is None
    for row in raw["windows"]:
        del row["gpu"]
    stalls = report.report(raw)["loads"][part]["stalls"]
    assert stalls["windows"] is None and stalls["by_arm"] == {} and "no GPU log" in stalls["note"]
    assert stalls["pearson_r_of_tokens_per_s_with"]["gpu_utilization_pct"] == {"r": None, "n": 0}
    assert stalls["pearson_r_of_tokens_per_s_with"]["mean_step_ms"]["r"] == -1.0


def test_a_gc_log_adds_the_share_of_each_window_spent_collecting_to_the_stalls(
    report: ModuleType,
) -> None:
    """Windows with vLLM's GC lines joined (gc_log.py): the share they took goes into the
    stalls' correlations and means; a run without them has no such figure."""
    raw, part = stall_run(with_host=True)
    for row in raw["windows"]:  # a collection share that grows as the GPU idles
        row["gc"] = {
            "collections": 1,
            "share": round((100.0 - row["gpu"]["utilization_pct"]) / 100, 4),
        }
    stalls = report.report(raw)["loads"][part]["stalls"]
    assert stalls["pearson_r_of_tokens_per_s_with"]["gc_share"] == {"r": -1.0, "n": 8}
    assert stalls["pearson_r_within_arms"]["gc_share"]["n"] == 8
    assert stalls["stalled_vs_other"]["gc_share"] == {"stalled": 0.383, "other": 0.04}
    assert report.report(raw)["loads"][part]["windows"][1]["gc"]["share"] == 0.4
    raw, part = stall_run(with_host=True)
    stalls = report.report(raw)["loads"][part]["stalls"]
    assert "gc_share" not in stalls["pearson_r_of_tokens_per_s_with"]
    assert "gc_share" not in stalls["stalled_vs_other"]


def test_the_report_reads_the_host_log_beside_the_raw_file_or_the_one_named(
    tmp_path: Path,
) -> None:
    """The job's files as eval_traffic.sh leaves them: the raw JSON, gpu_clocks.csv and
    host_load.csv named in its meta."""
    host = load_gpu_module("host_logger")
    raw, part = stall_run(with_host=False)
    start = datetime(2026, 12, 1, 2, 46, 49, tzinfo=UTC)
    for i, row in enumerate(raw["windows"]):
        del row["gpu"]
        row["started_utc"] = (start + timedelta(seconds=5 * i)).isoformat()
        row["ended_utc"] = (start + timedelta(seconds=5 * i + 4)).isoformat()
    raw["meta"].update(
        date="2026-12-01T02:44:17+00:00",
        host_load={"path": "host_load.csv", "pgid": 10, "interval_s": 1.0},
    )
    lines = [",".join(host.COLUMNS)]
    for s in range(1, 41):
        stalled = s // 5 in (1, 3, 6)  # inside the stalled windows the engine core waits
        at = (start + timedelta(seconds=s)).isoformat(timespec="milliseconds")
        lines.append(f"{at},1.000,16,0.1200,0.0000,0.0000,11,engine_core,VLLM::EngineCore,"
                     f"{0.7 if stalled else 1.0},2.0,40.0,{0.3 if stalled else 0.0}")  # fmt: skip
    (tmp_path / "host_load.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "raw.json").write_text(json.dumps(raw))
    command = [sys.executable, "bench/gpu/eval_traffic_report.py", str(tmp_path / "raw.json"),
               "--out", str(tmp_path / "report.json")]  # fmt: skip
    root = ROOT
    done = subprocess.run(command, capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "report.json").read_text())
    assert result["host_load"] == {"path": "host_load.csv", "aligned": "recorded",
                                   "samples": 40, "roles": ["engine_core"], "cpus": 16}  # fmt: skip
    windows = result["loads"][part]["windows"]
    assert [w["host"]["engine_core_cpu"] for w in windows] == [1.0, 0.7, 1.0, 0.7, 1.0, 1.0,
                                                                0.7, 1.0]  # fmt: skip
    r = result["loads"][part]["stalls"]["pearson_r_of_tokens_per_s_with"]
    assert r["engine_core_cpu"]["r"] > 0.9 and r["engine_core_runqueue_wait"]["r"] < -0.9
    assert r["gpu_utilization_pct"] == {"r": None, "n": 0}  # no GPU log beside it
    (tmp_path / "other.csv").write_text("timestamp, index\n")
    done = subprocess.run([*command, "--host-load", str(tmp_path / "other.csv")],
                          capture_output=True, text=True, cwd=root)  # fmt: skip
    assert done.returncode == 2 and "--host-load" in done.stderr and "Traceback" not in done.stderr


def test_within_arms_a_figure_is_correlated_around_each_arms_median(report: ModuleType) -> None:
    """k3 runs longer steps and makes more tokens than k1: across arms the mean step goes with
    tokens/s, within each arm a longer step costs tokens (r = -1)."""

    def line(index: int, arm: str, tokens: float, step_ms: float) -> dict[str, Any]:
        engine = {"steps": 100.0, "mean_step_ms": step_ms, "prompt_tokens_per_s": 1.0,
                  "mean_running": 190.0}  # fmt: skip
        return {"index": index, "arm": arm, "tokens_per_s": tokens, "engine": engine,
                "gpu": {"utilization_pct": 95.0}}  # fmt: skip

    lines = [
        line(0, "k1", 10000.0, 30.0), line(1, "k3", 12000.0, 40.0),
        line(2, "k1", 9000.0, 33.0), line(3, "k3", 11000.0, 43.0),
        line(4, "k1", 9500.0, 31.5), line(5, "k3", 12500.0, 38.5),
    ]  # fmt: skip
    stalls = report.stalls(lines)
    assert stalls["pearson_r_of_tokens_per_s_with"]["mean_step_ms"]["r"] > 0.5
    within = stalls["pearson_r_within_arms"]
    assert within["mean_step_ms"] == {"r": -1.0, "n": 6}
    assert within["gpu_utilization_pct"] == {"r": None, "n": 6}  # flat


def test_the_daemon_settings_a_launch_changed_are_kept_in_its_meta() -> None:
    eval_traffic_driver()  # loads live_daemon and what it imports by name
    pick = sys.modules["live_daemon"].daemon_settings_from_env
    environ = {
        "TABLETUNE_DECISION__TRIALS": "true",
        "TABLETUNE_PLUGIN__NEIGHBOUR_DROP_Z": "2",
        "TABLETUNE_SYNC_INTERVAL_S": "0.05",  # the plugin's, not the daemon's
        "PATH": "/usr/bin",
    }
    assert pick(environ) == {
        "TABLETUNE_DECISION__TRIALS": "true",
        "TABLETUNE_PLUGIN__NEIGHBOUR_DROP_Z": "2",
    }


def _pushed(old: list[list[int]], new: list[list[int]], reason: str, **extra: Any) -> str:
    return json.dumps({"event": "table pushed", "old": old, "new": new, "reason": reason, **extra})


START_Q = [[1, 16, 3], [17, 32, 1], [33, 256, 0]]
STANDING = [[1, 184, 3], [185, 256, 2]]
TRIAL = [[1, 184, 3], [185, 192, 1], [193, 256, 2]]


def test_a_daemon_stopped_inside_a_trial_stood_on_the_table_the_trial_replaced(
    report: ModuleType,
) -> None:
    from live_daemon_report import trial_at_stop

    settled = [_pushed(START_Q, STANDING, "predicted gain +9%"), "not json", '{"event": "x"}']
    assert trial_at_stop(settled) is None
    started = [*settled, _pushed(STANDING, TRIAL, "trial of k=1 at 185-192: ...", trial=[1, 190])]
    assert trial_at_stop(started)["standing"] == STANDING
    assert trial_at_stop(started)["table"] == TRIAL and trial_at_stop(started)["trial"] == [1, 190]
    before_the_field = [*settled, _pushed(STANDING, TRIAL, "trial of k=1 at 185-192: ...")]
    assert trial_at_stop(before_the_field)["standing"] == STANDING  # logs from before the field
    ended = [*started, _pushed(TRIAL, STANDING, "trial ended")]
    assert trial_at_stop(ended) is None
    assert trial_at_stop([]) is None

    part = "chat-like-B192"
    rows = [window(f"{part}-daemon", "live", 9000.0, 1)]
    for arm, tps, k in (("k1", 10000.0, 1), ("k2", 12000.0, 2), ("daemon", 10000.0, 1)) * 2:
        rows.append(window(f"{part}-arms", arm, tps, k))
    run = raw_run(rows, [{"part": part, "shape": "chat-like", "clients": 192}])
    run["daemon_log_tails"] = {f"{part}-daemon": started}
    load = report.report(run)["loads"][part]
    assert load["daemon_trial_at_stop"]["standing"] == STANDING
    standing = load["tables_by_k_mix"]["daemon_standing"]
    assert standing["k_time_mix"] == {2: 1.0} and standing["loss_from_k_mix"] == 0.0
    assert load["daemon_by_k_mix"]["loss_from_k_mix"] == pytest.approx(1 - 10000 / 12000, abs=1e-4)
    run["daemon_log_tails"] = {f"{part}-daemon": ended}
    load = report.report(run)["loads"][part]
    assert "daemon_trial_at_stop" not in load and "daemon_standing" not in load["tables_by_k_mix"]


def test_a_log_kept_gzipped_reads_as_the_job_wrote_it(report: ModuleType, tmp_path: Path) -> None:
    text = "timestamp, index, utilization.gpu [%]\n2026/12/01 14:35:24.123, 0, 97 %\n"
    plain = tmp_path / "gpu_clocks.csv"
    plain.write_text(text)
    kept = tmp_path / "gpu_clocks_h200_20261201T1435Z.csv.gz"
    kept.write_bytes(gzip.compress(text.encode()))
    assert report.log_text(kept) == report.log_text(plain) == text
    assert report.log_name(kept) == "gpu_clocks_h200_20261201T1435Z.csv"
    plain.unlink()
    gz_beside = tmp_path / "gpu_clocks.csv.gz"
    gz_beside.write_bytes(kept.read_bytes())
    raw_path = tmp_path / "eval_traffic.json"
    meta = {"gpu_clocks": {"path": "gpu_clocks.csv"}}
    assert report.beside(raw_path, meta, "gpu_clocks") == gz_beside
    assert report.beside(raw_path, {"gpu_clocks": {"path": "other.csv"}}, "gpu_clocks") is None


def test_the_shape_change_rotates_every_fixed_k_and_its_time_counts_them(
    driver: ModuleType,
) -> None:
    """k0 too: the daemon's bursts run it after the change, and a k no arm ran is priced as lost
    whole; the time the change needs grows with the arms it rotates."""
    live = run_of(driver, json.loads(CHAT_B192_12S.read_text())["meta"])
    live.args.max_num_seqs, live.args.change_before_s, live.args.change_after_s = 256, 36, 90
    tables = live.change_tables([[1, 256, 1]], [[1, 256, 3]])
    assert list(tables) == ["k0", "k1", "k2", "k3", "before", "after"]
    assert tables["k0"] == [[1, 256, 0]] and tables["before"] == [[1, 256, 1]]
    seconds = 36 + 90
    assert live.change_needs_s(2) == live.needs_s(6, seconds, 2)


def test_the_model_check_sets_counted_tokens_against_what_the_steps_give_by_the_model(
    report: ModuleType,
) -> None:
    # k=3 at B=190, 100 steps of 30 ms: the model gives 190·(1 + 0.75 + 0.55 + 0.40) per step.
    kept = 100 * 190 * 2.70
    exact = {**window("p", "k3", 0.0, 3), "wall_s": 3.0,
             "vllm": {"vllm:generation_tokens_total": kept}}  # fmt: skip
    gaps = {**exact, "arm": "gapped", "wall_s": 6.0}  # the same steps with the host idle between
    bare = window("p", "k0", 0.0, 0)  # no vLLM counters recorded: not checked
    check = report.model_check([exact, gaps, bare], ["k3", "gapped", "k0"], [0.75, 0.55, 0.40])
    assert check["k3"]["counted_over_modelled"] == pytest.approx(1.0)
    assert check["k3"]["modelled_tokens_per_s"] == pytest.approx(kept / 3.0, rel=1e-3)
    assert check["gapped"]["counted_over_modelled"] == pytest.approx(0.5)
    assert check["gapped"]["tokens_counted_over_modelled"] == pytest.approx(1.0)
    assert check["gapped"]["step_seconds_over_wall"] == pytest.approx(0.5)
    assert "k0" not in check


@pytest.mark.parametrize(
    ("device", "name", "expected"),
    [
        ("NVIDIA H200, 580.159.04", None, "eval_traffic_decode_heavy_h200.json"),
        ("NVIDIA H100 80GB HBM3, 580.159.04", None, "eval_traffic_decode_heavy_h100.json"),
        ("NVIDIA H100 80GB HBM3, 580.159.04", "b256_blocks", "eval_traffic_b256_blocks_h100.json"),
        ("NVIDIA A100-SXM4-80GB, 550.54", None, "eval_traffic_decode_heavy_a100.json"),
        (None, None, "eval_traffic_decode_heavy_gpu.json"),
    ],
)
def test_a_report_is_named_after_the_gpu_its_launch_ran_on(
    report: ModuleType, device: str | None, name: str | None, expected: str
) -> None:
    """A launch on an H100 (2026-12-06: an H200 was asked for, an H100 came) was written as
    ..._h200.json, where the H200 summary pools every such report: the name now reads the GPU."""
    meta = {"shape": "decode-heavy"} | ({"device": device} if device else {})
    assert report.report_name(meta, name) == expected
