"""bench/gpu/host_logger.py run for real against a process group it did not start: a group
leader (as vLLM's API server) and a child titled as vLLM titles its engine core, busy for a
while then gone; the logger stopped by SIGTERM, or gone with the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gpu_jobs import GPU, rows_of

pytestmark = pytest.mark.integration

LOGGER = str(GPU / "host_logger.py")
BUSY_S = 1.5
# The leader idles; its child spins for BUSY_S under the title vLLM gives its engine core
# (bash's exec -a writes argv[0], where setproctitle writes the title).
GROUP = (
    f"(exec -a VLLM::EngineCore {sys.executable} -c "
    f"'import time; end = time.monotonic() + {BUSY_S}\nwhile time.monotonic() < end: pass') & "
    f"exec {sys.executable} -c 'import time; time.sleep(30)'"
)


@pytest.fixture
def group() -> Iterator[int]:
    """The group's id (its leader's pid); the whole group ended at the end."""
    leader = subprocess.Popen(["bash", "-c", GROUP], start_new_session=True)
    yield leader.pid
    os.killpg(leader.pid, signal.SIGKILL)
    leader.wait()


def gone(pid: int) -> bool:
    """Exited (reaped, or a zombie not yet reaped by whoever adopted it)."""
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def test_the_logger_sees_the_groups_busy_process_come_and_go_and_stops_on_sigterm(
    group: int, tmp_path: Path
) -> None:
    out = tmp_path / "host_load.csv"
    logger = subprocess.Popen([sys.executable, LOGGER, "--out", str(out), "--pgid", str(group),
                               "--interval-s", "0.25"], stderr=subprocess.PIPE)  # fmt: skip
    time.sleep(BUSY_S + 1.5)  # the child's busy life and a second after it
    logger.send_signal(signal.SIGTERM)
    _, stderr = logger.communicate(timeout=10)
    assert logger.returncode == 0, stderr
    rows = rows_of(out)
    engine = [r for r in rows if r["role"] == "engine_core"]
    leader = [r for r in rows if r["pid"] == str(group)]
    assert engine and {r["name"] for r in engine} == {"VLLM::EngineCore"}
    assert max(float(r["cpu"]) for r in engine) > 0.2  # spinning (on a shared 2-core machine)
    assert leader and {r["role"] for r in leader} == {"api_server"}
    assert min(float(r["cpu"]) for r in leader) < 0.1  # asleep
    assert rows[-1]["role"] != "engine_core"  # the child gone, its rows stopped, the log went on
    for r in rows:
        assert 0 <= float(r["host_busy"]) <= 1 and int(r["cpus"]) >= 1
        assert float(r["interval_s"]) > 0
    assert engine[0]["involuntary_per_s"] != "" and engine[0]["runqueue_wait"] != ""


def test_the_logger_ends_when_the_process_that_started_it_is_gone(tmp_path: Path) -> None:
    out = tmp_path / "host_load.csv"
    starter = subprocess.run(
        ["bash", "-c", f"{sys.executable} {LOGGER} --out {out} --interval-s 0.1 & echo $!; "
         "sleep 0.5"],
        capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    logger = int(starter.stdout.split()[0])
    deadline = time.monotonic() + 5
    while not gone(logger) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(logger)
    rows = rows_of(out)
    assert rows and all(r["pid"] == "" for r in rows)  # no group named: the host alone
