"""The demo's pure parts: which profile it picks, what it records and says each cycle."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tabletune.demo.cli import SAMPLE_PROFILE, choose_profile
from tabletune.demo.truth import Timeline, record, summary
from tabletune.demo.view import line
from tabletune.schemas import load_profile
from tabletune.schemas.profile import step_times_of

REPO = Path(__file__).resolve().parents[2]
MEASURED = REPO / "profiles" / "h200-qwen3-4b-eagle3.json"
QUARTER = [[1, 16, 3], [17, 32, 1], [33, 128, 0]]


def test_outside_a_checkout_the_packaged_sample_is_chosen(tmp_path: Path) -> None:
    assert choose_profile(tmp_path) == SAMPLE_PROFILE


def test_a_measured_profile_wins_over_the_sample_and_broken_files_are_skipped(
    tmp_path: Path,
) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "a-broken.json").write_text("{")
    shutil.copy(SAMPLE_PROFILE, tmp_path / "profiles" / "b-sample.json")
    assert choose_profile(tmp_path) == SAMPLE_PROFILE  # a sample is not a measurement
    shutil.copy(MEASURED, tmp_path / "profiles" / "c-measured.json")
    assert choose_profile(tmp_path) == tmp_path / "profiles" / "c-measured.json"
    # The README's profile wins over other measured ones, which sort before it by name (the
    # MoE target's h200-qwen3-30b-a3b-… did, and the demo ran it).
    shutil.copy(MEASURED, tmp_path / "profiles" / MEASURED.name)
    assert choose_profile(tmp_path) == tmp_path / "profiles" / MEASURED.name
    assert choose_profile(REPO) == REPO / "profiles" / MEASURED.name


def truth(sim_s: float, table: list[list[int]], efficiency: float) -> dict[str, Any]:
    return {
        "sim_time_s": sim_s,
        "speed": 20.0,
        "rates": [0.75, 0.55, 0.4],
        "table": table,
        "oracle_table": [[1, 256, 3]],
        "current": {"batch_size": 96},
        "intervals": [
            {
                "start_s": sim_s - 10.0,
                "end_s": sim_s,
                "tokens": 1000.0 * efficiency,
                "oracle_tokens": 1000.0,
                "expected_goodput_tokens_per_s": 20000.0 * efficiency,
                "efficiency": efficiency,
            }
        ],
    }


@pytest.fixture
def step_times() -> Any:
    return step_times_of(load_profile(SAMPLE_PROFILE))


def test_each_cycle_is_one_line_with_a_hat_and_goodput(step_times: Any) -> None:
    timeline = Timeline()
    first = truth(0.0, QUARTER, 0.5)
    record(first, (), timeline, step_times, pushed=False)
    assert "a_hat=prior" in line(first, (), timeline)
    second = truth(15.0, [[1, 256, 3]], 0.97)
    record(second, (0.75, 0.55, 0.4), timeline, step_times, pushed=True)
    shown = line(second, (0.75, 0.55, 0.4), timeline)
    assert "B= 96" in shown
    assert "a_hat=(0.750, 0.550, 0.400)" in shown
    assert "goodput 19,400 tok/s, 97.0% of the oracle" in shown
    assert "worst loss over all B 0.0%" in shown
    assert "\n" not in shown


def test_the_summary_tells_the_measured_goodput_before_and_after_the_first_push(
    step_times: Any,
) -> None:
    timeline = Timeline()
    # Cycles every 15 s, intervals of 10 s: each cycle sees two, some twice; the push at 25 s
    # falls into the interval 20-30 s, which counts on neither side.
    for sim_s, table, intervals, pushed in [
        (10.0, QUARTER, [(0.0, 0.5)], False),
        (25.0, [[1, 256, 3]], [(10.0, 0.6), (20.0, 0.7)], True),
        (40.0, [[1, 256, 3]], [(20.0, 0.7), (30.0, 0.9)], False),
        (55.0, [[1, 256, 3]], [(40.0, 1.0)], False),
    ]:
        seen = truth(sim_s, table, 0.0)
        seen["intervals"] = [interval(start, share) for start, share in intervals]
        record(seen, (), timeline, step_times, pushed=pushed)
    said = summary(timeline)
    assert said.startswith("demo: 1 push(es); starting table lost")
    assert "within 1.5 % of the oracle at every load from t=25 s" in said
    assert "55.0% of the oracle before the first push, 95.0% after" in said
    assert timeline.pushes == [25.0]


def test_without_a_push_the_summary_says_what_was_measured(step_times: Any) -> None:
    timeline = Timeline()
    record(truth(10.0, QUARTER, 0.5), (), timeline, step_times, pushed=False)
    said = summary(timeline)
    assert said.startswith("demo: 0 push(es)")
    assert "never" in said
    assert said.endswith(
        "measured by the emulator: 50.0% of the oracle (the plugin's exploration steps included)"
    )


def interval(start_s: float, share: float) -> dict[str, float]:
    return {
        "start_s": start_s,
        "end_s": start_s + 10.0,
        "tokens": 1000.0 * share,
        "oracle_tokens": 1000.0,
    }
