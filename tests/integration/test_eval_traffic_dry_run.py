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

from tests.support.gpu_jobs import dry_run

pytestmark = pytest.mark.integration

DRIVER_ARGS = (
    "--loads 6,decode-heavy:4 --arms k1,k3,measured,daemon,nightjar --nightjar-learn-s 0.5 "
    "--warmup-s 1 --window-s 1 "
    "--settle-s 0.5 --daemon-s 3 --daemon-cycle-s 1 --shape-change decode-heavy:chat-like:4 "
    "--change-before-s 2 --change-after-s 3"
)


# nvidia-smi on a host of two GPUs: its name, or its once-a-second log until stopped (its pid
# written down, to see that the job stopped it); GPU 1 busier than GPU 0.
FAKE_NVIDIA_SMI = """#!/usr/bin/env bash
case " $* " in
  *" -l "*)
    echo $$ >"$FAKE_NVIDIA_SMI_PID"
    echo "timestamp, index, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], \
temperature.gpu, utilization.gpu [%], clocks_event_reasons.active"
    while :; do
      now=$(date '+%Y/%m/%d %H:%M:%S.%3N')
      echo "$now, 0, 345 MHz, 3201 MHz, 80.00 W, 30, 10 %, 0x0000000000000001"
      echo "$now, 1, 1755 MHz, 3201 MHz, 650.00 W, 55, 90 %, 0x0000000000000004"
      sleep 0.2
    done ;;
  *) echo "Fake H200, 0.0" ;;
esac
"""


def fake_nvidia_smi(folder: Path) -> Path:
    folder.mkdir()
    tool = folder / "nvidia-smi"
    tool.write_text(FAKE_NVIDIA_SMI)
    tool.chmod(0o755)
    return folder


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
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    raw = json.loads((out / "eval_traffic.json").read_text())
    assert raw["errors"] == [] and raw["skipped"] == [] and raw["meta"]["commit"] == "dry-run"
    assert list(raw["rounds"].values()) == [{"planned": 2, "run": 2}] * 3  # 2 loads, the change
    # The GPU log: written while the job ran, its logger stopped by its id at the end.
    assert raw["meta"]["gpu_clocks"]["job_gpus"] == "1"
    assert len((out / "gpu_clocks.csv").read_text().splitlines()) > 10
    logger = int((tmp_path / "smi.pid").read_text())
    status = Path(f"/proc/{logger}/status")
    assert not status.exists() or "zombie" in status.read_text()
    assert all(w["started_utc"] < w["ended_utc"] for w in raw["windows"])
    parts = ["chat-like-B6", "decode-heavy-B4"]
    assert [load["part"] for load in raw["meta"]["loads"]] == parts
    for part in parts:
        arms = [w["arm"] for w in raw["windows"] if w["part"] == f"{part}-arms"]
        assert arms == ["k1", "k3", "measured", "daemon", "nightjar", "nightjar", "daemon",
                        "measured", "k3", "k1"]  # fmt: skip
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
    for load in report["loads"].values():  # GPU 1's samples alone
        assert all(w["gpu"]["samples"] > 0 for w in load["windows"])
        assert {w["gpu"]["utilization_pct"] for w in load["windows"]} == {90.0}
    assert set(report["loads"]) == set(parts)
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
    assert sorted(set(arms)) == ["after", "before", "k1", "k2", "k3"] and len(arms) == 10
    assert report["shape_change"]["windows_after_the_change"]
    assert report["goals"]["shape_change"]["measured"] is not None
