"""bench/gpu/gpu_clocks.py: the GPUs' once-a-second log read and set beside windows, recorded
or rebuilt from the driver's schedule (checked against the H200 launch's own log)."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.gpu_jobs import load_gpu_module

RAW = Path(__file__).resolve().parents[2] / "bench" / "results" / "gpu_raw"
HEADER = (
    "timestamp, index, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], "
    "temperature.gpu, utilization.gpu [%], clocks_event_reasons.active\n"
)


@pytest.fixture(scope="module")
def clocks() -> ModuleType:
    return load_gpu_module("gpu_clocks")


def line(at: str, index: int, sm: str = "1980 MHz", util: str = "90 %", reasons: str = "0x4",
         power: str = "600.00 W") -> str:  # fmt: skip
    return f"{at}, {index}, {sm}, 3201 MHz, {power}, 50, {util}, {reasons}\n"


def test_the_log_is_read_by_column_past_headers_and_gaps(clocks: ModuleType) -> None:
    text = (
        HEADER
        + line("2026/12/01 00:00:36.471", 1, reasons="0x0000000000000004")
        + line("2026/12/01 00:00:37.471", 0, sm="[N/A]", util="[N/A]", reasons="[N/A]")
        + "Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error\n"
        + HEADER
        + line("2026/12/01 00:00:38.471", 1)
    )
    samples = clocks.read_clocks(text, "+0100")
    assert [s.index for s in samples] == [1, 0, 1]
    first = samples[0]
    assert first.at == datetime(2026, 11, 30, 23, 0, 36, 471000, tzinfo=UTC)  # local +01:00
    assert (first.sm_mhz, first.power_w, first.utilization_pct, first.reasons) == (
        1980.0, 600.0, 90.0, 4)  # fmt: skip
    assert samples[1].sm_mhz is None and samples[1].reasons is None


@pytest.mark.parametrize("bad", ["", "0100", "+01", "+01:00", "UTC"])
def test_a_bad_utc_offset_is_refused(clocks: ModuleType, bad: str) -> None:
    with pytest.raises(ValueError, match="UTC offset"):
        clocks.utc_offset(bad)


def test_the_jobs_gpus_come_from_cuda_visible_devices(clocks: ModuleType) -> None:
    assert clocks.job_gpus("1") == {1} and clocks.job_gpus("0,1") == {0, 1}
    assert clocks.job_gpus(None) is None and clocks.job_gpus("") is None
    assert clocks.job_gpus("GPU-8d1c0f3e-aaaa") is None  # UUIDs: every GPU's samples


@given(
    utils=st.lists(st.integers(0, 100), min_size=1, max_size=30),
    reasons=st.lists(st.sampled_from([0x0, 0x1, 0x4, 0x24]), min_size=30, max_size=30),
)
def test_a_window_gets_the_means_and_reason_shares_of_its_gpus_samples_inside_it(
    clocks: ModuleType, utils: list[int], reasons: list[int]
) -> None:
    start = datetime(2026, 12, 1, tzinfo=UTC)
    inside = [clocks.Sample(start + timedelta(seconds=i), 1, 1800.0, 600.0, float(u), r)
              for i, (u, r) in enumerate(zip(utils, reasons, strict=False))]  # fmt: skip
    other_gpu = [clocks.Sample(start, 0, 345.0, 80.0, 0.0, 0x1)]
    outside = [clocks.Sample(start - timedelta(seconds=1), 1, 345.0, 80.0, 0.0, 0x1)]
    end = start + timedelta(seconds=len(utils) - 1)
    gpu = clocks.window_gpu(inside + other_gpu + outside, start, end, {1})
    assert gpu["samples"] == len(utils) and gpu["sm_clock_mhz"] == 1800.0
    assert gpu["utilization_pct"] == round(sum(utils) / len(utils), 1)
    seen = reasons[: len(utils)]
    for bit, name in ((0x4, "sw_power_cap"), (0x20, "sw_thermal_slowdown")):
        share = sum(1 for r in seen if r & bit) / len(seen)
        assert gpu["throttle_reasons"].get(name, 0.0) == round(share, 2)
    assert "gpu_idle" not in gpu["throttle_reasons"] or 0x1 in seen
    assert clocks.window_gpu(inside, end + timedelta(seconds=1), end + timedelta(seconds=2),
                             {1}) is None  # fmt: skip


def run(windows: list[dict[str, Any]], durations: dict[str, float]) -> dict[str, Any]:
    meta = {"date": "2026-12-01T00:00:00+00:00", "startup_s": 60.0, "settle_s": 2.0,
            "nightjar": {"learn_s": 10.0}}  # fmt: skip
    return {"meta": meta, "windows": windows, "durations_s": durations}


def test_windows_without_times_are_rebuilt_from_the_schedule(clocks: ModuleType) -> None:
    rows = [
        {"part": "B8-daemon", "arm": "live", "wall_s": 5.0},
        {"part": "B8-daemon", "arm": "live", "wall_s": 5.0},
        {"part": "B8-arms", "arm": "k3", "wall_s": 5.0},
        {"part": "B8-arms", "arm": "nightjar", "wall_s": 5.0},
        {"part": "B16-arms", "arm": "k1", "wall_s": 5.0},
    ]
    spans, unaccounted = clocks.reconstructed_spans(run(rows, {"B8": 60.0, "B16": 30.0}))
    ready = datetime(2026, 12, 1, 0, 1, tzinfo=UTC)
    offsets = [((a - ready).total_seconds(), (b - ready).total_seconds()) for a, b in spans]
    # warm-up 6; daemon windows back to back; settle 2 before each arm, + learning 10 for nightjar
    assert offsets == [(6, 11), (11, 16), (18, 23), (35, 40), (60 + 6 + 2, 60 + 13)]
    assert unaccounted == {"B8": 20.0, "B16": 30 - 13.0}
    with pytest.raises(ValueError, match="without a recorded duration"):
        clocks.reconstructed_spans(run(rows, {"B8": 60.0}))


def test_windows_with_recorded_times_are_aligned_by_them(clocks: ModuleType) -> None:
    rows = [{"part": "B8-arms", "arm": "k3", "wall_s": 2.0,
             "started_utc": "2026-12-01T00:00:01.000+00:00",
             "ended_utc": "2026-12-01T00:00:03.000+00:00"}]  # fmt: skip
    log = HEADER + "".join(line(f"2026/12/01 00:00:0{s}.500", 0, util=f"{10 * s} %")
                           for s in range(6))  # fmt: skip
    how = clocks.annotate(run(rows, {}), clocks.read_clocks(log), None)
    assert how["aligned"] == "recorded" and "unaccounted_s_per_part" not in how
    gpu = rows[0]["gpu"]
    assert gpu["samples"] == 2 and gpu["utilization_pct"] == 15.0  # 00:01.5 and 00:02.5
    assert gpu["started_utc"] == rows[0]["started_utc"] and gpu["aligned"] == "recorded"


def test_the_rebuilt_schedule_of_the_h200_launch_meets_its_gpu_going_busy(
    clocks: ModuleType,
) -> None:
    """2026-11-30: the eval ran on GPU 1; the load's clients start at the rebuilt ready time,
    when GPU 1 went from idle to busy."""
    raw = json.loads((RAW / "eval_traffic_chat_like_b192_12s_h200_20261130T2359Z.json").read_text())
    kept = RAW / "gpu_clocks_h200x2_20261130T2359Z.csv.gz"
    log = clocks.read_clocks(gzip.decompress(kept.read_bytes()).decode())
    ready = datetime.fromisoformat(raw["meta"]["date"]) + timedelta(
        seconds=raw["meta"]["startup_s"]
    )
    gpu1 = [s for s in log if s.index == 1]
    before = [s for s in gpu1 if ready - timedelta(seconds=2) <= s.at < ready]
    after = [s for s in gpu1 if ready <= s.at < ready + timedelta(seconds=2)]
    assert before and all(s.utilization_pct == 0 for s in before)
    assert max(s.utilization_pct for s in after) == 100
    how = clocks.annotate(raw, log, {1})
    assert how["aligned"] == "reconstructed (approximate)"
    assert 0 < how["unaccounted_s_per_part"]["chat-like-B192"] < 10
    assert all(w["gpu"]["samples"] >= 11 for w in raw["windows"])  # 12 s windows, 1 Hz
    assert all(w["gpu"]["utilization_pct"] > 50 for w in raw["windows"])  # under load
