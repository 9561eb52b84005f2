"""A dry run of the GPU job bench/gpu/profile_fast.sh (its driver and report) on a CPU, against
the vLLM stand-in built from the plugin's real parts (tests/support/vllm_stand_in.py): a cold
launch stopped and a warm one profiled, both in-flight grids with their wall time by phase, the
request-method cross-check and acceptance through the profiler hook, every file where the job
puts it, before it spends H200 time."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from tests.support.gpu_jobs import dry_run, load_gpu_module

pytestmark = pytest.mark.integration

DRIVER_ARGS = (
    "--max-num-seqs 8 --dense-until 4 --grid-step 4 --cross-check 1,8 "
    "--acceptance-prompts 32 --acceptance-tokens 64"
)


def test_the_gpu_job_profiles_twice_cross_checks_and_writes_its_results(tmp_path: Path) -> None:
    done = dry_run(
        "profile_fast.sh",
        tmp_path,
        BUDGET_S="200",
        DRIVER_ARGS=DRIVER_ARGS,
        WARM_START="1",
        WARM_NEEDS_S="60",  # the stand-in's second start and grids take seconds
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    raw = json.loads((tmp_path / "profile_fast.json").read_text())
    assert raw["errors"] == [] and raw["skipped"] == [] and raw["meta"]["commit"] == "dry-run"
    meta = raw["meta"]
    assert meta["warm_start"] is True and meta["cold_start_s"] > 0 and meta["before_s"] > 0
    assert meta["wall_s"] > meta["before_s"] + meta["startup_s"]
    assert raw["meta"]["engine"]["max_capture_size"] is None  # the stand-in logs no config
    run1, run2 = raw["runs"]["run1"], raw["runs"]["run2"]
    for run in (run1, run2):
        assert run["timing_method"] == "in-flight" and run["batch_grid"] == [1, 2, 3, 4, 8]
        assert run["cells"] == 5 * 4 and run["windows_taken_again"] == 0
    assert len(run1["cross_check"]["cells"]) == 2 * 4 and run2["cross_check"] is None
    assert run1["acceptance"]["rates"] == pytest.approx([0.75, 0.55, 0.40], abs=0.01)
    assert run2["acceptance"] is None
    assert {"timing", "cross_check", "acceptance", "total"} <= set(run1["wall_time_s"])
    phases = {"timing.stop", "timing.settle", "timing.k_switch", "timing.fill"}
    assert phases <= set(run1["wall_time_s"])
    assert sum(run1["wall_time_s"][p] for p in phases) <= run1["wall_time_s"]["timing"]
    assert run1["in_flight_events"]["windows"] == 5 * 4 * 3
    # the stand-in's plugin has the step-cells route: every reading went there, none to /metrics
    assert run1["in_flight_events"]["route_reads"] == run1["in_flight_events"]["reads"]
    # each run's folder is packed into one archive (a device call brings back at most 8 files)
    assert not (tmp_path / "run1").exists()
    assert len(list(tmp_path.iterdir())) <= 8
    with tarfile.open(tmp_path / "profile_fast_runs.tgz") as runs:
        runs.extractall(tmp_path / "unpacked", filter="data")
    for name in ("run1", "run2"):
        profile = json.loads((tmp_path / "unpacked" / name / "profile.json").read_text())
        assert profile["metadata"]["timing_method"] == "in-flight"
        assert (tmp_path / "unpacked" / name / "profile.raw.json").exists()
    report = load_gpu_module("profile_fast_report")
    summary = report.summarize(raw)
    assert raw["summary"] == json.loads(json.dumps(summary))  # the driver embeds the same summary
    assert set(raw["tables"]) == {"run1", "run2"}
    written = json.loads((tmp_path / "profile_fast_h200.json").read_text())
    assert written["goals"] == json.loads(json.dumps(report.goals(summary)))
    assert set(written["goals"]) == {
        "grid_with_engine_start",
        "methods_agree",
        "tables_repeat",
        "job_within_9_minutes",
    }
    assert written["goals"]["job_within_9_minutes"]["pass"] is True
    start = written["goals"]["grid_with_engine_start"]
    assert start["start"].startswith("warm") and start["cold_start_s"] == meta["cold_start_s"]
    # (the stand-in runs its steps, the plugin's sync and the profiler's reads on one event
    # loop, so how well the two methods agree there says nothing about vLLM)
    assert (tmp_path / "profile_fast_h200.png").read_bytes()[:4] == b"\x89PNG"
    log = (tmp_path / "profile_fast_run_log.txt").read_text()
    assert log.count("== ") == 3 and "cold start: " in log
