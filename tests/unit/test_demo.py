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
    for sim_s, table, efficiency, pushed in [
        (0.0, QUARTER, 0.5, False),
        (15.0, [[1, 256, 3]], 0.9, True),
        (30.0, [[1, 256, 3]], 1.0, False),
    ]:
        record(truth(sim_s, table, efficiency), (), timeline, step_times, pushed=pushed)
    said = summary(timeline)
    assert said.startswith("demo: 1 push(es); starting table lost")
    assert "within 1.5 % of the oracle at every load from t=15 s" in said
    assert "50.0% of the oracle before the first push, 95.0% after" in said
    assert timeline.pushes == [15.0]
