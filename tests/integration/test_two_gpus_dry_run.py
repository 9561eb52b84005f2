"""A dry run of bench/gpu/two_gpus.sh on a CPU, with a fake nvidia-smi and two small jobs: each
job sees its own GPU, port and folder; the GPUs' and the host's logs run meanwhile and are
stopped by their ids; everything the jobs wrote is packed."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.support.gpu_jobs import GPU, fake_nvidia_smi, logger_of, rows_of

pytestmark = pytest.mark.integration

JOB = 'sleep 1; echo "$CUDA_VISIBLE_DEVICES $PORT" >"$OUT/seen.txt"'


def test_two_jobs_run_side_by_side_under_both_logs(tmp_path: Path) -> None:
    out, tools = tmp_path / "out", fake_nvidia_smi(tmp_path / "bin")
    env = {
        **os.environ,
        "PATH": f"{tools}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "OUT": str(out),
        "JOB0": JOB,
        "JOB1": f"{JOB}; exit 3",
        "FAKE_NVIDIA_SMI_PID": str(tmp_path / "smi.pid"),
    }
    done = subprocess.run(["bash", str(GPU / "two_gpus.sh")], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr  # the failing job's code
    with tarfile.open(out / "jobs.tgz") as jobs:
        seen = {name: jobs.extractfile(f"gpu{name}/seen.txt").read().decode() for name in "01"}
    assert seen == {"0": "0 8000\n", "1": "1 8001\n"}
    assert len((out / "gpu_clocks.csv").read_text().splitlines()) > 5
    rows = rows_of(out / "host_load.csv")
    assert rows and all(r["pid"] == "" and r["host_busy"] != "" for r in rows)  # the host alone
    assert logger_of(out / "host_load.csv") is None
