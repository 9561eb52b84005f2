"""Dry runs of the GPU jobs under bench/gpu on a CPU: the job script run against the vLLM
stand-in (tests/support/vllm_stand_in.py), a fake nvidia-smi, the host log read back, and the
job's report module loaded by path."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "bench" / "gpu"


def engine_state(raw: dict[str, Any]) -> Any:
    """The table state a recorded GPU launch's engine started with (its captured k), from the
    raw run's speculative config, for replaying its windows' tables as views."""
    from tabletune.admin.state import TableState

    return TableState.initial(
        raw["meta"]["speculative_config"]["num_speculative_tokens_per_batch_size"],
        num_speculative_tokens=3,
        max_num_seqs=256,
    )


def load_gpu_module(name: str) -> ModuleType:
    """``bench/gpu/<name>.py`` as a module (the folder is no package), registered under its
    name: the folder's scripts import each other by name, and dataclasses look their module up.
    The folder goes on the import path as when a script of it runs (its own folder first), so
    a module imports what it needs whichever test loaded it first."""
    if str(GPU) not in sys.path:
        sys.path.insert(0, str(GPU))
    spec = importlib.util.spec_from_file_location(name, GPU / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def eval_traffic_driver() -> ModuleType:
    """bench/gpu/eval_traffic.py, after the modules it imports by name."""
    for name in ("live_step_time_report", "traffic", "live_step_time", "live_daemon_report",
                 "live_daemon"):  # fmt: skip
        load_gpu_module(name)
    return load_gpu_module("eval_traffic")


def eval_traffic_report() -> ModuleType:
    """bench/gpu/eval_traffic_report.py, after the modules it imports by name."""
    eval_traffic_driver()
    for name in ("gpu_clocks", "gc_log", "host_logger", "host_load", "eval_traffic_paired"):
        load_gpu_module(name)
    return load_gpu_module("eval_traffic_report")


def dry_run(script: str, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``bench/gpu/<script>`` against the stand-in on a free port, results under ``out``."""
    full = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # python3 = this one
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
        "WHEEL": "none",
        "SERVER_MODULE": "tests.support.vllm_stand_in",
        "PORT": str(free_port()),
        "OUT": str(out),
        "COMMIT": "dry-run",
        **env,
    }
    full.pop("TABLETUNE_ADMIN_TOKEN", None)
    return subprocess.run(
        ["bash", str(GPU / script)], env=full, capture_output=True, text=True, timeout=240
    )


# nvidia-smi on a host of two GPUs: its name, or its once-a-second log until stopped (its pid
# written down, to see that the job stopped it); GPU 1 busier than GPU 0.
FAKE_NVIDIA_SMI = """#!/usr/bin/env bash
case " $* " in
  *" -l "* | *" -lms "*)
    echo $$ >"$FAKE_NVIDIA_SMI_PID"
    echo "$*" >"$FAKE_NVIDIA_SMI_PID.args"
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
    """A folder holding the fake nvidia-smi, to put first on PATH."""
    folder.mkdir()
    tool = folder / "nvidia-smi"
    tool.write_text(FAKE_NVIDIA_SMI)
    tool.chmod(0o755)
    return folder


def rows_of(path: Path) -> list[dict[str, str]]:
    """A host_load.csv's rows by column, after checking its last line is whole and every line
    has the header's width."""
    text = path.read_text()
    assert text.endswith("\n")
    rows = list(csv.reader(text.splitlines()))
    assert all(len(row) == len(rows[0]) for row in rows)
    return [dict(zip(rows[0], row, strict=True)) for row in rows[1:]]


def logger_of(path: Path) -> int | None:
    """The pid of a host logger still writing ``path`` (read from /proc), or None."""
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # not a process, or gone
        if any(a.endswith(b"host_logger.py") for a in args) and str(path).encode() in args:
            return int(entry.name)
    return None
