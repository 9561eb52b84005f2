"""Interleaved blocks (bench/gpu/eval_traffic.py --rounds-per-block, eval_traffic_paired.py):
the driver's visits grouped into balanced blocks, each arm's block tokens/s as Σ tokens / Σ
seconds of its windows, the paired statistic on blocks, and a stall that hits every arm of a
block alike cancelling in the block's ratios."""

from __future__ import annotations

import math
import statistics
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.step_cells import CellTotals, cells_to_wire
from tests.support.gpu_jobs import ROOT, load_gpu_module
from tests.unit.eval_traffic.test_eval_traffic import raw_run, window, with_k_mix

ARMS = ["k1", "k2", "k3", "daemon", "nightjar"]


@pytest.fixture(scope="module")
def paired() -> ModuleType:
    return load_gpu_module("eval_traffic_paired")


# -- the driver's visits ------------------------------------------------------------------------


@given(arms=st.lists(st.sampled_from(ARMS), min_size=1, max_size=5, unique=True),
       per_block=st.sampled_from([1, 2, 4, 6]), blocks=st.integers(1, 4))  # fmt: skip
def test_every_block_holds_every_arm_equally_often_at_the_same_mean_place(
    driver: ModuleType, arms: list[str], per_block: int, blocks: int
) -> None:
    rounds = per_block * blocks if per_block > 1 else 2 * blocks
    visits = driver.visits(arms, rounds, per_block)
    assert [v["arm"] for v in visits] == driver.rotations(arms, rounds)  # the same order
    assert [v["index"] for v in visits] == list(range(len(visits)))
    assert all(v["round"] == v["index"] // len(arms) for v in visits)
    assert all(v["block"] == v["round"] // per_block for v in visits)
    for block in {v["block"] for v in visits}:
        held = [v for v in visits if v["block"] == block]
        places = {arm: [v["index"] % len(arms) for v in held if v["arm"] == arm] for arm in arms}
        assert {len(p) for p in places.values()} == {per_block}
        if per_block > 1:  # a stall inside a block favours no arm on average
            means = {statistics.fmean(p) for p in places.values()}
            assert max(means) - min(means) < 1e-9


@given(arms=st.lists(st.sampled_from(ARMS), min_size=2, max_size=5, unique=True),
       per_block=st.sampled_from([2, 4, 6]), data=st.data())  # fmt: skip
def test_a_stall_hits_the_arms_of_a_block_equally_often_give_or_take_two_visits(
    driver: ModuleType, arms: list[str], per_block: int, data: st.DataObject
) -> None:
    """A stall is a run of consecutive visits: the tail of one round, whole rounds, the head
    of another; within a block it hits every arm as often as any other but for two visits at
    most (what leaves a block's ratio moved: at most 2/N of the stall's depth)."""
    visits = driver.visits(arms, 2 * per_block, per_block)
    start = data.draw(st.integers(0, len(visits) - 1))
    hit = visits[start : data.draw(st.integers(start + 1, len(visits)))]
    for block in {v["block"] for v in hit}:
        counts = [sum(v["arm"] == arm and v["block"] == block for v in hit) for arm in arms]
        assert max(counts) - min(counts) <= 2


@given(planned=st.integers(1, 60), unit=st.sampled_from([2, 4, 6, 8]),
       per_round=st.floats(1, 100), fixed=st.floats(0, 200),
       left=st.floats(0, 5000))  # fmt: skip
def test_a_load_runs_its_plan_or_the_most_whole_blocks_that_fit(
    driver: ModuleType, planned: int, unit: int, per_round: float, fixed: float, left: float
) -> None:
    def needs(rounds: int) -> float:
        return fixed + per_round * rounds

    rounds = driver.rounds_that_fit(planned, needs, left, unit)
    if needs(planned) <= left:
        assert rounds == planned
    elif needs(unit) > left or planned <= unit:
        assert rounds == 0
    else:
        assert rounds % unit == 0 and unit <= rounds < planned and needs(rounds) <= left
        assert needs(rounds + unit) > left or rounds + unit >= planned


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rounds-per-block", "3", "--rounds", "6"], "--rounds-per-block 3: 1 or even"),
        (["--rounds-per-block", "0"], "--rounds-per-block 0: 1 or even"),
        (["--rounds-per-block", "4", "--rounds", "10"], "--rounds 10: whole blocks of 4"),
        (["--nightjar-s", "0"], "--nightjar-s 0: > 0"),
    ],
)
def test_blocks_that_cannot_be_balanced_are_a_one_line_error(
    flags: list[str], message: str, tmp_path: Any
) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "bench/gpu/eval_traffic.py", "--out", str(tmp_path / "o.json"), *flags],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": "src", "PATH": ""},
        cwd=ROOT,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "o.json").exists()


# -- block tokens/s and the paired statistic on blocks -----------------------------------------


def arm_window(arm: str, block: int, tokens_per_s: float, wall_s: float) -> dict[str, Any]:
    return {"arm": arm, "block": block, "tokens_per_s": tokens_per_s, "wall_s": wall_s}


def test_a_blocks_tokens_per_s_is_its_tokens_over_its_seconds(paired: ModuleType) -> None:
    windows = [
        arm_window("k3", 0, 12000.0, 4.0), arm_window("daemon", 0, 11000.0, 2.0),
        arm_window("daemon", 0, 12000.0, 2.0), arm_window("k3", 0, 10000.0, 1.0),
        arm_window("k3", 1, 9000.0, 1.0), arm_window("daemon", 1, 9900.0, 1.0),
        arm_window("daemon", 1, 8100.0, 1.0), arm_window("k3", 1, 9000.0, 1.0),
    ]  # fmt: skip
    blocks = paired.whole_blocks(windows, 2)[0]
    assert blocks == [{"k3": pytest.approx(58000 / 5), "daemon": pytest.approx(46000 / 4)},
                      {"k3": pytest.approx(9000.0), "daemon": pytest.approx(9000.0)}]  # fmt: skip
    ratios = paired.paired(blocks, "daemon", "k3")
    assert ratios["ratios"] == [round(11500 / 11600, 4), 1.0]
    assert ratios["spread_of_ratios"] == pytest.approx(1.0 - 11500 / 11600, abs=1e-4)


def test_a_block_missing_a_window_is_left_out(paired: ModuleType) -> None:
    """A part that failed inside a block: its last block is not whole, so not balanced."""
    windows = [arm_window("k3", 0, 100.0, 1.0), arm_window("k1", 0, 90.0, 1.0),
               arm_window("k1", 0, 90.0, 1.0), arm_window("k3", 0, 100.0, 1.0),
               arm_window("k3", 1, 50.0, 1.0), arm_window("k1", 1, 90.0, 1.0)]  # fmt: skip
    assert paired.whole_blocks(windows, 2) == ([{"k3": 100.0, "k1": 90.0}], 1)


def stalled(windows: list[dict[str, Any]], factor: float, start: int, stop: int) -> list[Any]:
    """``windows`` (in run order) with those from ``start`` to ``stop`` slowed by ``factor``:
    a stall of the engine, every arm running then alike."""
    return [dict(w, tokens_per_s=w["tokens_per_s"] * factor) if start <= i < stop else w
            for i, w in enumerate(windows)]  # fmt: skip


def rotated(driver: ModuleType, arms: list[str], per_block: int, levels: list[float],
            walls: list[float]) -> list[Any]:  # fmt: skip
    """Windows in the driver's order (rotations), blocks of ``per_block`` rounds; the n-th
    window's tokens/s and wall seconds from ``levels`` and ``walls`` (cycled)."""
    blocks = max(1, len(levels) // (len(arms) * per_block))
    return [
        arm_window(v["arm"], v["block"], levels[n % len(levels)], walls[n % len(walls)])
        for n, v in enumerate(driver.visits(arms, per_block * blocks, per_block))
    ]


ARM_SETS = st.lists(st.sampled_from(ARMS), min_size=2, max_size=4, unique=True)
LEVELS = st.lists(st.floats(1000, 20000), min_size=8, max_size=64)
WALLS = st.lists(st.floats(0.9, 1.3), min_size=1, max_size=8)


@given(arms=ARM_SETS, per_block=st.sampled_from([2, 4]), levels=LEVELS, walls=WALLS,
       factor=st.floats(0.3, 1.0), data=st.data())  # fmt: skip
def test_a_stall_spanning_whole_blocks_leaves_the_block_ratios_unchanged(
    driver: ModuleType, paired: ModuleType, arms: list[str], per_block: int, levels: list[float],
    walls: list[float], factor: float, data: st.DataObject,
) -> None:  # fmt: skip
    windows = rotated(driver, arms, per_block, levels, walls)
    size = len(arms) * per_block  # windows in a block
    count = len(windows) // size
    first = data.draw(st.integers(0, count - 1))
    last = data.draw(st.integers(first, count - 1))
    hit = stalled(windows, factor, first * size, (last + 1) * size)
    before, after = (
        paired.whole_blocks(windows, per_block)[0],
        paired.whole_blocks(hit, per_block)[0],
    )
    assert len(after) == len(before) == count
    for was, now in zip(before, after, strict=True):
        for arm in arms[1:]:
            assert now[arm] / now[arms[0]] == pytest.approx(was[arm] / was[arms[0]], rel=1e-9)


@given(arms=ARM_SETS, per_block=st.sampled_from([2, 4]), levels=LEVELS, walls=WALLS,
       factor=st.floats(0.3, 1.0), data=st.data())  # fmt: skip
def test_a_blocks_tokens_per_s_is_sum_over_sum_wherever_a_stall_falls(
    driver: ModuleType, paired: ModuleType, arms: list[str], per_block: int,
    levels: list[float], walls: list[float], factor: float, data: st.DataObject,
) -> None:  # fmt: skip
    windows = rotated(driver, arms, per_block, levels, walls)
    start = data.draw(st.integers(0, len(windows)))
    hit = stalled(windows, factor, start, data.draw(st.integers(start, len(windows))))
    blocks = paired.whole_blocks(hit, per_block)[0]
    for b, block in enumerate(blocks):
        for arm in arms:
            mine = [w for w in hit if w["block"] == b and w["arm"] == arm]
            tokens = sum(w["tokens_per_s"] * w["wall_s"] for w in mine)
            assert block[arm] == pytest.approx(tokens / sum(w["wall_s"] for w in mine))


@given(arms=ARM_SETS, per_block=st.sampled_from([2, 4]), levels=LEVELS)
def test_with_windows_of_one_length_blocks_never_widen_the_spread_of_the_rounds(
    driver: ModuleType, paired: ModuleType, arms: list[str], per_block: int, levels: list[float]
) -> None:
    """A block's ratio is then a weighted mean of its rounds' ratios: within their range."""
    windows = rotated(driver, arms, per_block, levels, [1.0])
    rows = [dict(w, index=i) for i, w in enumerate(windows)]
    rounds, blocks = paired.by_round(rows), paired.whole_blocks(windows, per_block)[0]
    for arm in arms[1:]:
        by_round = paired.paired(rounds, arm, arms[0])["ratios"]
        for b, ratio in enumerate(paired.paired(blocks, arm, arms[0])["ratios"]):
            mine = by_round[b * per_block : (b + 1) * per_block]
            assert min(mine) - 1e-4 <= ratio <= max(mine) + 1e-4


@given(values=st.lists(st.floats(0.5, 1.5), min_size=1, max_size=40))
def test_the_median_interval_holds_the_median_and_covers_at_least_95_when_it_can(
    paired: ModuleType, values: list[float]
) -> None:
    interval = paired.median_interval(values)
    median = statistics.median(values)
    assert interval["low"] - 1e-4 <= median <= interval["high"] + 1e-4
    if len(values) >= 6:
        assert interval["coverage"] >= 0.95
    else:  # too few for 95 %: min..max and what it covers
        assert (interval["low"], interval["high"]) == (round(min(values), 4),
                                                       round(max(values), 4))  # fmt: skip
        assert interval["coverage"] == round(1 - 2 / 2 ** len(values), 3)


# -- the report on a run of blocks --------------------------------------------------------------


def block_run(
    driver: ModuleType, per_block: int, stall_blocks: set[int],
    extra: dict[str, tuple[float, int]] | None = None,
) -> tuple[dict[str, Any], str]:  # fmt: skip
    """Chat-like B=192, 6 blocks: the daemon 2 % below k3 and running k=3 like it; k1 at 75 %
    of k3; every window of a stalled block at half speed (all arms alike); ``extra`` arms
    (tokens/s, k) in the rotation too."""
    part = "chat-like-B192"
    level = {"k1": (9000.0, 1), "k3": (12000.0, 3), "daemon": (11760.0, 3), **(extra or {})}
    rows = []
    for v in driver.visits(list(level), 6 * per_block, per_block):
        tps, k = level[v["arm"]]
        row = window(f"{part}-arms", v["arm"], tps * (0.5 if v["block"] in stall_blocks else 1), k)
        rows.append({**row, "wall_s": 1.0, **v})
    raw = raw_run(rows, [{"part": part, "shape": "chat-like", "clients": 192}])
    raw["meta"]["rounds_per_block"] = per_block
    return raw, part


def test_blocks_pair_each_arm_with_the_best_fixed_k_and_judge_the_goal_on_them(
    driver: ModuleType, report: ModuleType
) -> None:
    raw, part = block_run(driver, per_block=2, stall_blocks={1, 4})
    result = report.report(raw)
    load = result["loads"][part]
    assert load["best_fixed_k"] == "k3"  # by the mean of its windows, as before
    assert load["blocks"] == {"rounds_per_block": 2, "run": 6, "left_out": 0}
    daemon = load["arms"]["daemon"]["blocks"]
    assert daemon["ratios"] == [0.98] * 6 and daemon["spread_of_ratios"] == 0.0
    assert daemon["loss_vs_best_fixed_k"] == pytest.approx(0.02)
    assert daemon["tokens_per_s"] == [11760.0, 5880.0, 11760.0, 11760.0, 5880.0, 11760.0]
    assert load["arms"]["daemon"]["loss_is_a_result_blocks"] is True
    assert load["arms"]["k3"]["loss_is_a_result_blocks"] is False
    null = load["arms_running_one_and_the_same_k"]["k3"]["blocks_against_the_first"]["daemon"]
    assert null["median_ratio"] == pytest.approx(0.98)
    goal = result["goals"]["daemon_worst_load_loss_chat_like"]
    assert (goal["unit"], goal["rounds_per_block"]) == ("block", 2)
    assert goal["measured"] == pytest.approx(0.02) and goal["pass"] is True
    assert goal["judgeable"] is True and goal["largest_spread_of_ratios"] == 0.0
    assert goal["largest_same_k_paired_difference"] == pytest.approx(0.02)
    windows = goal["windows_and_rounds"]  # the per-window verdict, as without blocks
    assert windows["judgeable"] is False  # the stalls make the same-arm spread 50 %
    assert windows["paired"]["judgeable"] is True  # (each round here is inside one block)


def test_a_stall_over_part_of_a_round_widens_the_block_spread_past_judging(
    driver: ModuleType, report: ModuleType
) -> None:
    """Block 0's second round runs daemon, k3, k1; a stall over its last two windows hits k3
    and k1 but not the daemon: block 0's daemon/k3 ratio is 11760 / 9000."""
    raw, _ = block_run(driver, per_block=2, stall_blocks=set())
    for row in raw["windows"][4:6]:
        row["tokens_per_s"] *= 0.5
    goal = report.report(raw)["goals"]["daemon_worst_load_loss_chat_like"]
    assert goal["largest_spread_of_ratios"] == round(11760 / 9000 - 0.98, 4)
    assert goal["judgeable"] is False and goal["measured"] == pytest.approx(0.02)


def test_a_run_without_blocks_reports_as_before(driver: ModuleType, report: ModuleType) -> None:
    raw, part = block_run(driver, per_block=2, stall_blocks=set())
    del raw["meta"]["rounds_per_block"]
    for row in raw["windows"]:
        del row["round"], row["block"]
    result = report.report(raw)
    load = result["loads"][part]
    goal = result["goals"]["daemon_worst_load_loss_chat_like"]
    assert "blocks" not in load and "unit" not in goal
    assert all("blocks" not in arm and "loss_is_a_result_blocks" not in arm
               for arm in load["arms"].values())  # fmt: skip
    assert set(goal) == {
        "measured", "goal", "pass", "largest_same_arm_spread", "judgeable", "paired", "by_k_mix"
    }  # fmt: skip
    assert load["best_fixed_k_sign_test"]["unit"] == "round"  # rounds are the units then
    raw["meta"]["rounds_per_block"] = 1  # a run of today's design that recorded its blocks
    assert report.report(raw)["loads"] == result["loads"]


# -- which fixed k is best, and the daemon's loss from the k its steps ran -----------------------


@given(outcomes=st.lists(st.booleans(), max_size=30))
def test_the_sign_test_is_the_binomial_tail_of_the_units_the_best_led(
    paired: ModuleType, outcomes: list[bool]
) -> None:
    units = [{"k3": 2.0, "k1": 1.0} if ahead else {"k3": 1.0, "k1": 2.0} for ahead in outcomes]
    test = paired.sign_test(units, "k3", "k1")
    n, ahead = len(outcomes), sum(outcomes)
    assert (test["units"], test["best_ahead_in"]) == (n, ahead)
    tail = sum(math.comb(n, i) for i in range(ahead, n + 1)) / 2**n
    assert test["p_one_sided"] == round(tail, 4)
    if ahead == n:  # led in every unit: the smallest p there is
        assert test["p_one_sided"] == round(0.5**n, 4)
    if ahead < n:  # one more unit led never makes the order less sure
        more = paired.sign_test([*units, {"k3": 2.0, "k1": 1.0}], "k3", "k1")
        assert more["p_one_sided"] <= test["p_one_sided"] + 1e-4


def test_a_best_fixed_k_ahead_in_every_block_is_identified_and_the_daemon_running_it_passes(
    driver: ModuleType, report: ModuleType
) -> None:
    """The daemon's windows run 2 % below k3's (noise in a real engine: they run one k); judged
    by its k mix its loss is nothing, since k3 led k1 in all 6 blocks (p = 1/64)."""
    raw, part = block_run(driver, per_block=2, stall_blocks={1, 4})
    result = report.report(raw)
    load = result["loads"][part]
    sign = load["best_fixed_k_sign_test"]
    assert sign["against"] == {"k1": {"units": 6, "best_ahead_in": 6, "p_one_sided": 0.0156}}
    assert (sign["unit"], sign["fixed_arms_run"], sign["identified"]) == (
        "block", ["k1", "k3"], True)  # fmt: skip
    assert load["daemon_by_k_mix"] == {
        "share_at_best_k": 1.0, "loss_from_k_mix": 0.0, "share_at_k_not_run": 0.0,
        "own_k": 3, "share_at_own_k": 1.0,
        "loss_upper_bound": 0.0, "loss_lower_bound": 0.0, "coverage": 0.969}  # fmt: skip
    by_mix = result["goals"]["daemon_worst_load_loss_chat_like"]["by_k_mix"]
    assert by_mix["measured"] == 0.0 and by_mix["pass"] is True and by_mix["judgeable"] is True


def test_a_fixed_k_ahead_of_the_daemons_in_some_blocks_leaves_its_loss_unbounded(
    driver: ModuleType, report: ModuleType
) -> None:
    raw, part = block_run(driver, per_block=2, stall_blocks=set())
    for row in raw["windows"]:
        if row["arm"] == "k1" and row["block"] in (0, 1):  # k1 ahead of k3 in two blocks
            row["tokens_per_s"] = 13500.0
    result = report.report(raw)
    sign = result["loads"][part]["best_fixed_k_sign_test"]
    assert sign["against"]["k1"] == {"units": 6, "best_ahead_in": 4, "p_one_sided": 0.3438}
    assert sign["identified"] is False
    by_mix = result["goals"]["daemon_worst_load_loss_chat_like"]["by_k_mix"]
    assert by_mix["measured"] == 0.0 and by_mix["judgeable"] is False and by_mix["pass"] is False
    assert by_mix["loss_upper_bound"] == round(1 - 12000 / 13500, 4)  # in two of six blocks
    assert by_mix["loss_lower_bound"] == 0.0


@pytest.mark.parametrize(
    ("steps", "share", "loss", "upper", "judgeable"),
    [
        ({3: 99.0, 1: 1.0}, 0.99, round(0.01 * 0.25, 4), 0.01, True),  # k1: 25 % below k3
        ({3: 90.0, 1: 10.0}, 0.9, 0.025, 0.1, False),  # too much of another k to bound it
        ({3: 98.0, 0: 2.0}, 0.98, 0.02, 0.02, True),  # k0 was not run: its steps lost whole
    ],
)
def test_the_daemons_steps_at_other_k_cost_their_share_of_that_ks_loss(
    driver: ModuleType, report: ModuleType, steps: dict[int, float], share: float,
    loss: float, upper: float, judgeable: bool,
) -> None:  # fmt: skip
    raw, part = block_run(driver, per_block=2, stall_blocks=set())
    raw["windows"] = [with_k_mix(row, steps) if row["arm"] == "daemon" else row
                      for row in raw["windows"]]  # fmt: skip
    result = report.report(raw)
    mix = result["loads"][part]["daemon_by_k_mix"]
    assert (mix["share_at_best_k"], mix["loss_from_k_mix"]) == (share, loss)
    assert mix["loss_upper_bound"] == upper and (mix["own_k"], mix["share_at_own_k"]) == (3, share)
    by_mix = result["goals"]["daemon_worst_load_loss_chat_like"]["by_k_mix"]
    assert by_mix["measured"] == loss and by_mix["judgeable"] is judgeable
    assert by_mix["pass"] is judgeable  # within the goal here whenever judged


def test_a_daemon_on_a_clearly_worse_k_misses_judged_by_its_k_mix(
    driver: ModuleType, report: ModuleType
) -> None:
    """The daemon ran k1, which trails k3 by 25 % in every block: missed beyond doubt."""
    raw, part = block_run(driver, per_block=2, stall_blocks={2})
    raw["windows"] = [with_k_mix(row, {1: 100.0}) if row["arm"] == "daemon" else row
                      for row in raw["windows"]]  # fmt: skip
    result = report.report(raw)
    mix = result["loads"][part]["daemon_by_k_mix"]
    assert (mix["own_k"], mix["loss_from_k_mix"]) == (1, 0.25)
    assert mix["loss_lower_bound"] == 0.25
    by_mix = result["goals"]["daemon_worst_load_loss_chat_like"]["by_k_mix"]
    assert by_mix["judgeable"] is True and by_mix["pass"] is False


@pytest.mark.parametrize(("daemon_tps", "loss"), [(12360.0, 0.0), (11400.0, 0.05)])
def test_a_daemon_on_one_k_no_fixed_arm_ran_is_priced_by_its_own_arm(
    driver: ModuleType, report: ModuleType, daemon_tps: float, loss: float
) -> None:
    """The daemon ran k2 alone, which no fixed arm ran (on the H200 at 17:43 2026-12-02,
    decode-heavy B≈126 with k0, k1 and k3 run): its arm, exploring off, is that k's fixed
    arm, so it is priced by its own tokens/s against the best fixed arm run, not counted as
    lost whole."""
    raw, part = block_run(driver, per_block=2, stall_blocks=set())
    raw["windows"] = [
        with_k_mix({**row, "tokens_per_s": daemon_tps}, {2: 100.0}) if row["arm"] == "daemon"
        else row for row in raw["windows"]
    ]  # fmt: skip
    result = report.report(raw)
    mix = result["loads"][part]["daemon_by_k_mix"]
    assert (mix["own_k"], mix["share_at_k_not_run"]) == (2, 1.0)
    assert mix["priced_by"] == "its own arm (its one k ran as no fixed arm)"
    assert mix["loss_from_k_mix"] == pytest.approx(loss, abs=1e-4)
    assert mix["loss_lower_bound"] == pytest.approx(loss, abs=1e-4)
    assert mix["loss_upper_bound"] == pytest.approx(loss, abs=1e-4)
    by_mix = result["goals"]["daemon_worst_load_loss_chat_like"]["by_k_mix"]
    assert by_mix["measured"] == mix["loss_from_k_mix"] and by_mix["judgeable"] is True


@pytest.mark.parametrize(
    ("steps", "loss", "low", "up", "passed", "judgeable"),
    [
        ({3: 60.0, 1: 40.0}, 0.1, 0.1, 0.1, True, True),  # 40 % of steps at k1, 25 % below k3
        ({3: 90.0, 0: 10.0}, 0.0, 0.0, 0.1, False, False),  # k0 not run: priced at nothing
    ],
)
def test_the_nightjar_arm_is_judged_by_its_k_mix_against_the_daemons_upper_bound(
    driver: ModuleType, report: ModuleType, steps: dict[int, float], loss: float, low: float,
    up: float, passed: bool, judgeable: bool,
) -> None:  # fmt: skip
    raw, part = block_run(driver, per_block=2, stall_blocks={3}, extra={"nightjar": (10800.0, 3)})
    raw["windows"] = [with_k_mix(row, steps) if row["arm"] == "nightjar" else row
                      for row in raw["windows"]]  # fmt: skip
    result = report.report(raw)
    mine = result["loads"][part]["nightjar_by_k_mix"]
    assert (mine["loss_from_k_mix"], mine["loss_lower_bound"], mine["loss_upper_bound"]) == (
        loss, low, up)  # fmt: skip
    by_mix = result["goals"]["nightjar_style_loss_3x_daemon"]["by_k_mix"]
    assert by_mix["measured"]["nightjar_worst_load_loss"] == loss
    assert by_mix["daemon_loss_upper_bound"] == 0.0  # the daemon ran k3, ahead in every block
    assert by_mix["pass"] is passed and by_mix["judgeable"] is judgeable


def test_without_a_nightjar_arm_in_blocks_its_k_mix_goal_is_absent(
    driver: ModuleType, report: ModuleType
) -> None:
    raw, part = block_run(driver, per_block=2, stall_blocks=set())
    result = report.report(raw)
    assert "nightjar_by_k_mix" not in result["loads"][part]
    assert result["goals"]["nightjar_style_loss_3x_daemon"]["pass"] is None


def test_a_mix_is_priced_by_the_time_spent_at_each_k_not_by_its_steps(
    driver: ModuleType, report: ModuleType
) -> None:
    """Half the bandit's steps at k1 (20 ms), half at k3 (50 ms): 2/7 of its time at k1, which
    runs 25 % below k3, so it loses 2/7 x 25 %; by steps it would be 1/2 x 25 %."""
    raw, part = block_run(driver, per_block=2, stall_blocks=set(), extra={"nightjar": (1e4, 3)})
    raw["windows"] = [with_k_mix(row, {3: 50.0, 1: 50.0}, {3: 0.05, 1: 0.02})
                      if row["arm"] == "nightjar" else row for row in raw["windows"]]  # fmt: skip
    load = report.report(raw)["loads"][part]
    assert load["k_mix"]["nightjar"] == {1: 0.5, 3: 0.5}
    assert load["k_time_mix"]["nightjar"] == {1: round(2 / 7, 4), 3: round(5 / 7, 4)}
    assert load["nightjar_by_k_mix"]["loss_from_k_mix"] == round(0.2857 * 0.25, 4)


@given(
    shares=st.dictionaries(st.integers(0, 3), st.floats(0.01, 1.0), min_size=1),
    ratios=st.dictionaries(st.integers(0, 3), st.tuples(st.floats(0.3, 1.3), st.floats(0, 0.2),
                                                        st.floats(0, 0.2))),
)  # fmt: skip
def test_a_k_mix_is_priced_between_its_bounds_and_never_beyond_its_time_elsewhere(
    report: ModuleType,
    shares: dict[int, float],
    ratios: dict[int, tuple[float, float, float]],
) -> None:
    total = sum(shares.values())
    mix = {k: v / total for k, v in shares.items()}
    arms = {"k3": {}}  # the best; the others run where ``ratios`` names them
    for k, (median, below, above) in ratios.items():
        if k != 3:
            interval = {"low": median - below, "high": median + above, "coverage": 0.95}
            arms[f"k{k}"] = {"blocks": {"median_ratio": median, "median_ratio_interval": interval}}
    cost = report.k_mix_cost(mix, "k3", arms, "blocks")
    elsewhere = sum(v for k, v in mix.items() if k != 3)
    assert cost["priced_at_least"] - 1e-12 <= cost["priced"] <= cost["priced_at_most"] + 1e-12
    assert cost["priced_at_most"] + cost["share_at_k_not_run"] <= elsewhere + 1e-4
    not_run = sum(v for k, v in mix.items() if k != 3 and f"k{k}" not in arms)
    assert cost["share_at_k_not_run"] == round(not_run, 4)
    if elsewhere == 0:
        assert cost["priced_at_most"] == 0 and cost["share_at_k_not_run"] == 0


def test_the_documented_and_measured_tables_are_priced_by_the_k_they_would_run_here(
    driver: ModuleType, report: ModuleType
) -> None:
    """Every step at B=190: the measured table here runs k1 (25 % below k3 in every block),
    vLLM's documented one k0, which was not run: not priced, its share given apart."""
    raw, part = block_run(driver, per_block=2, stall_blocks=set())
    raw["meta"]["measured_table"] = {"ranges": [[1, 128, 3], [129, 256, 1]]}
    tables = report.report(raw)["loads"][part]["tables_by_k_mix"]
    assert tables["measured"]["k_time_mix"] == {1: 1.0}
    assert tables["measured"]["loss_from_k_mix"] == 0.25
    assert tables["documented"]["table"] == [[1, 64, 3], [65, 128, 1], [129, 256, 0]]
    assert tables["documented"]["k_time_mix"] == {0: 1.0}
    assert (tables["documented"]["loss_from_k_mix"],
            tables["documented"]["share_at_k_not_run"]) == (0.0, 1.0)  # fmt: skip


def test_a_table_is_priced_by_the_time_its_k_would_take_on_each_batch_cell(
    report: ModuleType,
) -> None:
    """Half the steps at B~100 (k1 ran there, 20 ms a step), half at B~190 (k3, 50 ms): a table
    with k1 at 100 and k3 at 190 spends 2/7 of its time at k1."""
    windows = [with_k_mix(window("p-arms", "x", 1.0, 1), {1: 50.0}, {1: 0.02}),
               with_k_mix(window("p-arms", "x", 1.0, 3), {3: 50.0}, {3: 0.05})]  # fmt: skip
    windows[0]["cells"] = cells_to_wire(
        {(1, 97, 104): CellTotals(50.0, 1.0, 0.02, 50.0 * 100 * 2, 50.0 * 100)}, 0.0)  # fmt: skip
    mix = report.table_time_mix([[1, 128, 1], [129, 256, 3]], windows)
    assert mix == {1: round(2 / 7, 4), 3: round(5 / 7, 4)}


def test_the_default_profiles_table_is_priced_beside_the_in_flight_one(
    driver: ModuleType, report: ModuleType
) -> None:
    """The issue asks for the measured table of the default (pure-decode) profile too: for the
    4B target it is profiles/h200-qwen3-4b-eagle3.table.json (k=1 from 164)."""
    raw, part = block_run(driver, per_block=2, stall_blocks=set())
    raw["meta"]["target"] = "qwen3-4b"
    raw["meta"]["measured_table"] = {"path": "profiles/h200-qwen3-4b-eagle3-inflight.table.json",
                                     "ranges": [[1, 128, 3], [129, 256, 1]]}  # fmt: skip
    tables = report.report(raw)["loads"][part]["tables_by_k_mix"]
    default = tables["measured_default_profile"]
    assert default["table"][-1] == [164, 256, 1] and default["k_time_mix"] == {1: 1.0}
    raw["meta"]["target"] = "no-such-target"
    assert "measured_default_profile" not in report.report(raw)["loads"][part]["tables_by_k_mix"]


def daemon_part(part: str, tables: list[list[list[int]]],
                mix: dict[int, float]) -> list[dict[str, Any]]:  # fmt: skip
    """The daemon part before the rotation: one window a second, each under its table (as
    the daemon's view showed it at the window's end), its steps at ``mix``."""
    return [{**with_k_mix(window(f"{part}-daemon", "live", 11000.0, 3), mix),
             "since_daemon_start_s": float(i + 1), "view": {"table": table}}
            for i, table in enumerate(tables)]  # fmt: skip


def test_the_daemons_own_windows_after_it_settled_are_priced_exploring_included(
    driver: ModuleType, report: ModuleType
) -> None:
    """Its table put k3 at the load at 4 s; the window that saw the push may hold the old k,
    so from 5 s on its five windows count: a tenth of their time at k1 (bursts), which runs
    25 % below k3, costs 2.5 %."""
    raw, part = block_run(driver, per_block=2, stall_blocks=set())
    old, new = [[1, 256, 1]], [[1, 256, 3]]
    raw["windows"] = daemon_part(part, [old] * 3 + [new] * 6, {3: 90.0, 1: 10.0}) + raw["windows"]
    mine = report.report(raw)["loads"][part]["daemon_exploring_by_k_mix"]
    assert (mine["settled_at_s"], mine["until_s"], mine["windows"]) == (4.0, 9.0, 5)
    assert mine["k_time_mix"] == {1: 0.1, 3: 0.9}
    assert mine["loss_from_k_mix"] == 0.025
    assert (mine["loss_lower_bound"], mine["loss_upper_bound"]) == (0.025, 0.025)


def test_a_daemon_that_settled_too_late_to_read_is_said_so(
    driver: ModuleType, report: ModuleType
) -> None:
    raw, part = block_run(driver, per_block=2, stall_blocks=set())
    tables = [[[1, 256, 1]]] * 6 + [[[1, 256, 3]]] * 3
    raw["windows"] = daemon_part(part, tables, {3: 100.0}) + raw["windows"]
    mine = report.report(raw)["loads"][part]["daemon_exploring_by_k_mix"]
    assert mine["loss_from_k_mix"] is None and mine["windows"] == 2
    assert "settled" in mine["note"]
