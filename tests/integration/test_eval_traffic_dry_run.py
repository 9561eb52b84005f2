"""A dry run of the GPU job bench/gpu/eval_traffic.sh (its driver, the daemon it starts and its
report) on a CPU, against the vLLM stand-in built from the plugin's real parts: every load's
daemon part and rotated arms, two shapes in one launch, a change of traffic under the running
daemon, the files where the job puts them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.support.gpu_jobs import dry_run, fake_nvidia_smi, load_gpu_module, logger_of, rows_of

pytestmark = pytest.mark.integration

DRIVER_ARGS = (
    "--loads 6,decode-heavy:4 --arms k1,k3,measured,daemon,nightjar --nightjar-learn-s 0.5 "
    "--warmup-s 1 --window-s 1 "
    "--settle-s 0.5 --daemon-s 3 --daemon-cycle-s 1 --shape-change decode-heavy:chat-like:4 "
    "--change-before-s 2 --change-after-s 3"
)


def test_the_gpu_job_runs_the_daemon_and_every_arm_at_every_load(tmp_path: Path) -> None:
    out, tools = tmp_path / "out", fake_nvidia_smi(tmp_path / "bin")
    done = dry_run(
        "eval_traffic.sh",
        out,
        BUDGET_S="200",
        TABLETUNE_SYNC_INTERVAL_S="0.2",
        DRIVER_ARGS=DRIVER_ARGS,
        PATH=f"{tools}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        CUDA_VISIBLE_DEVICES="1",
        FAKE_NVIDIA_SMI_PID=str(tmp_path / "smi.pid"),
        HOST_LOAD_S="0.25",
        GPU_CLOCKS_MS="250",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    raw = json.loads((out / "eval_traffic.json").read_text())
    assert raw["errors"] == [] and raw["skipped"] == [] and raw["meta"]["commit"] == "dry-run"
    assert raw["meta"]["code"] == load_gpu_module("code_fingerprint").fingerprint()
    assert list(raw["rounds"].values()) == [{"planned": 2, "run": 2}] * 3  # 2 loads, the change
    # The GPU log: written while the job ran, its logger stopped by its id at the end.
    assert raw["meta"]["gpu_clocks"]["job_gpus"] == "1"
    assert raw["meta"]["gpu_clocks"]["interval_ms"] == 250  # GPU_CLOCKS_MS, passed to the logger
    assert (tmp_path / "smi.pid.args").read_text().split()[-2:] == ["-lms", "250"]
    assert len((out / "gpu_clocks.csv").read_text().splitlines()) > 10
    logger = int((tmp_path / "smi.pid").read_text())
    status = Path(f"/proc/{logger}/status")
    assert not status.exists() or "zombie" in status.read_text()
    assert all(w["started_utc"] < w["ended_utc"] for w in raw["windows"])
    # The host log: the stand-in (vLLM's group, its leader) every quarter second, its logger
    # stopped and waited for (the file whole).
    logged = raw["meta"]["host_load"]
    assert (logged["path"], logged["interval_s"]) == ("host_load.csv", 0.25)
    leader = [r for r in rows_of(out / "host_load.csv") if r["pid"] == str(logged["pgid"])]
    assert len(leader) > 20 and {r["role"] for r in leader} == {"api_server"}
    assert logger_of(out / "host_load.csv") is None
    parts = ["chat-like-B6", "decode-heavy-B4"]
    assert [load["part"] for load in raw["meta"]["loads"]] == parts
    for part in parts:
        arms = [w["arm"] for w in raw["windows"] if w["part"] == f"{part}-arms"]
        # a zigzag order (every arm after every other alike over pairs), then its reverse
        assert arms == ["k1", "k3", "nightjar", "measured", "daemon", "daemon", "measured",
                        "nightjar", "k3", "k1"]  # fmt: skip
        bandit = [w["view"] for w in raw["windows"] if w["arm"] == "nightjar"]
        assert all(v["policy"] == "nightjar" for v in bandit)  # on in its windows
        table = [w["view"] for w in raw["windows"] if w["arm"] == "k1"]
        assert all(v["policy"] == "table" for v in table)  # and off after
        assert bandit[-1]["nightjar_steps"] > 0
        assert any(w["part"] == f"{part}-daemon" for w in raw["windows"])
        assert raw["daemon_tables"][part]  # the daemon's last table, run as the daemon arm
        assert any("daemon stopped" in line for line in raw["daemon_log_tails"][f"{part}-daemon"])
    report = json.loads((out / "eval_traffic_h200.json").read_text())
    assert report["gpu_clocks"]["aligned"] == "recorded" and report["gpu_clocks"]["gpus"] == [1]
    # A device call brings back at most 8 files: the PNG is drawn here from the raw run, not
    # there (beside GC_DEBUG's and STEP_TRACE's logs it was the ninth; the step trace was lost).
    assert not list(out.glob("*.png"))
    for load in report["loads"].values():  # GPU 1's samples alone
        assert all(w["gpu"]["samples"] > 0 for w in load["windows"])
        assert {w["gpu"]["utilization_pct"] for w in load["windows"]} == {90.0}
    assert set(report["loads"]) == set(parts)
    assert report["host_load"]["path"] == "host_load.csv"
    assert report["host_load"]["roles"] == ["api_server"]
    for load in report["loads"].values():
        assert any(w["host"]["samples"] > 0 for w in load["windows"])
        stalls = load["stalls"]  # the fake GPU busy 90 %: no stall; the stand-in's CPU known
        assert stalls["windows"] == 0 and stalls["stalled_vs_other"]["api_server_cpu"]["other"] > 0
        assert all(w["engine"]["steps"] > 0 for w in load["windows"])
    assert {"daemon_worst_load_loss_chat_like", "daemon_worst_load_loss_decode_heavy"} <= set(
        report["goals"]
    )
    for part in parts:
        assert report["loads"][part]["k_mix"]["k3"] == {"3": 1.0}
        assert "loss_vs_best_fixed_k" in report["loads"][part]["arms"]["nightjar"]
    assert report["goals"]["nightjar_style_loss_3x_daemon"]["measured"] is not None
    # The change of traffic under the running daemon, then the arms on the new traffic.
    change = raw["shape_change"]
    assert change["at_s"] == 2 and change["table_at_change"] and change["daemon_table"]
    arms = [w["arm"] for w in raw["windows"] if w["part"] == f"{change['part']}-arms"]
    assert sorted(set(arms)) == ["after", "before", "k0", "k1", "k2", "k3"] and len(arms) == 12
    assert report["shape_change"]["windows_after_the_change"]
    assert report["goals"]["shape_change"]["measured"] is not None


def test_the_gpu_job_runs_interleaved_blocks_of_short_visits(tmp_path: Path) -> None:
    """The next launch's design at a CPU's scale: half-second windows after a quarter second's
    settle (the plugin syncing every 0.05 s), rounds in blocks of two; the report pairs the
    arms on blocks and judges the goal on them."""
    out = tmp_path / "out"
    done = dry_run(
        "eval_traffic.sh",
        out,
        BUDGET_S="120",
        TABLETUNE_SYNC_INTERVAL_S="0.05",
        DRIVER_ARGS="--loads 4 --arms k1,k3,daemon,nightjar --warmup-s 1 --window-s 0.5 "
        "--settle-s 0.25 --daemon-s 2 --daemon-cycle-s 1 --rounds 4 --rounds-per-block 2 "
        "--nightjar-learn-s 0.5 --nightjar-s 1",
        GC_DEBUG="1",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    raw = json.loads((out / "eval_traffic.json").read_text())
    assert raw["errors"] == [] and raw["meta"]["rounds_per_block"] == 2
    assert raw["meta"]["gc_log"]["path"] == "gc_log.txt"
    assert (out / "gc_log.txt").read_text() == ""  # the stand-in logs no GC lines
    assert raw["rounds"] == {"chat-like-B4": {"planned": 4, "run": 4}}
    arms = [w for w in raw["windows"] if w["part"] == "chat-like-B4-arms"]
    assert [(w["round"], w["block"]) for w in arms] == [
        (r, r // 2) for r in range(4) for _ in "abc"
    ]
    report = json.loads((out / "eval_traffic_h200.json").read_text())
    load = report["loads"]["chat-like-B4"]
    assert load["blocks"] == {"rounds_per_block": 2, "run": 2, "left_out": 0}
    assert report["gc_log"]["collections"] == 0  # joined by the job's own report
    assert all(w["gc"]["collections"] == 0 for w in load["windows"])
    assert "gc_share" in load["stalls"]["pearson_r_of_tokens_per_s_with"]
    assert all(len(arm["blocks"]["ratios"]) == 2 for arm in load["arms"].values())
    # The bandit apart, once, after the rotation: its windows judged by the k its steps ran.
    bandit = [w for w in raw["windows"] if w["part"] == "chat-like-B4-nightjar"]
    assert [w["arm"] for w in bandit] == ["nightjar", "nightjar"]
    assert bandit[0]["started_utc"] > arms[-1]["ended_utc"]
    assert load["nightjar_run"]["windows"] == 2 and "nightjar" not in load["arms"]
    assert "loss_from_k_mix" in load["nightjar_by_k_mix"]
    assert report["goals"]["nightjar_style_loss_3x_daemon"]["by_k_mix"] is not None
    goal = report["goals"]["daemon_worst_load_loss_chat_like"]
    assert (
        goal["unit"] == "block"
        and goal["measured"] == load["arms"]["daemon"]["blocks"]["loss_vs_best_fixed_k"]
    )
