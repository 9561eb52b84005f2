"""A dry run of the GPU job bench/gpu/profile_fast.sh (its driver and report) on a CPU, against
the vLLM stand-in built from the plugin's real parts (tests/support/vllm_stand_in.py): both
in-flight grids, the request-method cross-check and acceptance through the profiler hook, every
file where the job puts it, before it spends H200 time."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.servers import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DRIVER_ARGS = (
    "--max-num-seqs 8 --dense-until 4 --grid-step 4 --cross-check 1,8 --window-steps 8 "
    "--acceptance-prompts 32 --acceptance-tokens 64"
)


def load_report() -> ModuleType:
    path = ROOT / "bench" / "gpu" / "profile_fast_report.py"
    spec = importlib.util.spec_from_file_location("profile_fast_report", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_job_profiles_twice_cross_checks_and_writes_its_results(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # python3 = this one
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
        "WHEEL": "none",
        "SERVER_MODULE": "tests.support.vllm_stand_in",
        "PORT": str(free_port()),
        "OUT": str(tmp_path),
        "BUDGET_S": "200",
        "COMMIT": "dry-run",
        "DRIVER_ARGS": DRIVER_ARGS,
    }
    env.pop("TABLETUNE_ADMIN_TOKEN", None)
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu" / "profile_fast.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    raw = json.loads((tmp_path / "profile_fast.json").read_text())
    assert raw["errors"] == [] and raw["skipped"] == [] and raw["meta"]["commit"] == "dry-run"
    assert raw["meta"]["engine"]["max_capture_size"] is None  # the stand-in logs no config
    run1, run2 = raw["runs"]["run1"], raw["runs"]["run2"]
    for run in (run1, run2):
        assert run["timing_method"] == "in-flight" and run["batch_grid"] == [1, 2, 3, 4, 8]
        assert run["cells"] == 5 * 4 and run["windows_taken_again"] == 0
    assert len(run1["cross_check"]["cells"]) == 2 * 4 and run2["cross_check"] is None
    assert run1["acceptance"]["rates"] == pytest.approx([0.75, 0.55, 0.40], abs=0.01)
    assert run2["acceptance"] is None
    assert {"timing", "cross_check", "acceptance", "total"} <= set(run1["wall_time_s"])
    for name in ("run1", "run2"):
        profile = json.loads((tmp_path / name / "profile.json").read_text())
        assert profile["metadata"]["timing_method"] == "in-flight"
        assert (tmp_path / name / "profile.raw.json").exists()
    report = load_report()
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
    # (the stand-in runs its steps, the plugin's sync and the profiler's reads on one event
    # loop, so how well the two methods agree there says nothing about vLLM)
    assert (tmp_path / "profile_fast_h200.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "profile_fast_run_log.txt").read_text().count("== ") == 3
