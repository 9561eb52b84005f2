"""A dry run of the GPU job bench/gpu/live_step_time.sh (and its driver and report) on a CPU,
against a small vLLM stand-in built from the plugin's real parts (tests/support/vllm_stand_in.py),
so the job's control flow is proven before it spends H200 time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.gpu_jobs import dry_run, load_gpu_module, logger_of, rows_of

pytestmark = pytest.mark.integration

DRIVER_ARGS = (
    "--clients 6 --warmup-s 1 --window-s 0.8 --settle-s 1.0 --rounds 2 --overhead-rounds 3 "
    "--neighbour-interval 4 --neighbour-window-s 1.2"
)


def test_the_gpu_job_runs_every_part_and_writes_its_results(tmp_path: Path) -> None:
    done = dry_run(
        "live_step_time.sh",
        tmp_path,
        BUDGET_S="200",
        TABLETUNE_SYNC_INTERVAL_S="0.2",
        DRIVER_ARGS=DRIVER_ARGS,
        GC_DEBUG="1",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # vLLM's GC lines kept (the stand-in logs none: the file is there, empty)
    assert (tmp_path / "gc_log.txt").read_text() == ""
    raw = json.loads((tmp_path / "live_step_time.json").read_text())
    assert raw["errors"] == [] and raw["skipped"] == [] and raw["meta"]["commit"] == "dry-run"
    parts = [(w["part"], w["arm"]) for w in raw["windows"]]
    assert parts[:4] == [("fixed-k", "k2"), ("fixed-k", "k3"), ("fixed-k", "k3"), ("fixed-k", "k2")]
    assert ("neighbour", "n4") in parts and parts.count(("overhead", "off")) == 3
    report = load_gpu_module("live_step_time_report")
    summary = report.summarize(raw)
    assert raw["summary"] == json.loads(json.dumps(summary))  # the driver embeds the same summary
    for arm in ("k2", "k3"):
        assert summary["fixed_k"]["arms"][arm]["share_of_decode_steps_at_k"] == 1
    assert summary["neighbour"]["steps_by_k"][2] > 0
    overhead = summary["overhead"]
    assert overhead["off"]["windows"] == 3 and overhead["off_steps_recorded"] == 0
    goals = json.loads((tmp_path / "live_step_time_h200.json").read_text())["goals"]
    assert goals == json.loads(json.dumps(report.goals(summary)))
    assert goals["counters_agree"]["pass"] is True, summary["counters"]
    # The stand-in's k=2 steps take 6 ms, k=3 steps 11 ms: k=2 out-produces k=3 by far.
    assert goals["t_hat_ranks_like_throughput"]["pass"] is True, summary["fixed_k"]["ranking"]
    assert (tmp_path / "live_step_time_run_log.txt").read_text().count("== ") == 5
    # The host log beside it: the stand-in, vLLM's group's leader, once a second; stopped.
    group = raw["meta"]["host_load"]["pgid"]
    rows = rows_of(tmp_path / "host_load.csv")
    assert {r["role"] for r in rows if r["pid"] == str(group)} == {"api_server"}
    assert any(float(r["cpu"]) > 0 for r in rows if r["pid"] == str(group))
    assert logger_of(tmp_path / "host_load.csv") is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GPU_CLOCKS_MS": "0.5"}, "GPU_CLOCKS_MS must be a positive integer (ms), got '0.5'"),
        ({"GPU_CLOCKS_MS": "abc"}, "GPU_CLOCKS_MS must be a positive integer (ms), got 'abc'"),
        ({"HOST_LOAD_S": "0.01"}, "HOST_LOAD_S must be seconds within 0.05..60, got '0.01'"),
        ({"HOST_LOAD_S": "1s"}, "HOST_LOAD_S must be seconds within 0.05..60, got '1s'"),
    ],
)
def test_a_bad_logger_interval_is_a_one_line_error_before_anything_starts(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    out = tmp_path / "out"
    done = dry_run("live_step_time.sh", out, **env)
    assert done.returncode == 2 and done.stderr.strip() == message
    assert not out.exists()  # nothing started, nothing written
