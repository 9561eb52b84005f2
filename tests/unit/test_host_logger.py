"""bench/gpu/host_logger.py: /proc read as text (host CPU, a process's CPU, context switches,
run-queue wait, vLLM's process titles), two readings turned into one second's rows, and a
fake /proc tree whose processes come and go."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.gpu_jobs import load_gpu_module

PROC_STAT = """cpu  1000 50 200 8000 100 10 40 600 0 0
cpu0 500 25 100 4000 50 5 20 300 0 0
cpu1 500 25 100 4000 50 5 20 300 0 0
intr 123456 0 0
ctxt 987654
procs_running 3
"""
STATUS = """Name:\tVLLM::EngineCor
State:\tR (running)
Threads:\t14
voluntary_ctxt_switches:\t1520
nonvoluntary_ctxt_switches:\t87
"""


@pytest.fixture(scope="module")
def logger() -> ModuleType:
    return load_gpu_module("host_logger")


def pid_stat(pid: int, comm: str, pgrp: int, utime: int, stime: int, start: int,
             state: str = "R") -> str:  # fmt: skip
    """A /proc/<pid>/stat line (fields 1-22 as the kernel writes them, the rest cut short)."""
    return (f"{pid} ({comm}) {state} 1 {pgrp} {pgrp} 0 -1 4194304 100 0 0 0 {utime} {stime} "
            f"0 0 20 0 14 0 {start} 3133440 356\n")  # fmt: skip


def test_the_host_line_gives_busy_iowait_steal_and_the_cpus(logger: ModuleType) -> None:
    host = logger.parse_proc_stat(PROC_STAT)
    # busy: user + nice + system + irq + softirq; total adds idle, iowait and steal
    assert (host.busy, host.iowait, host.steal) == (1300, 100, 600)
    assert host.total == 1000 + 50 + 200 + 8000 + 100 + 10 + 40 + 600 and host.cpus == 2
    later = logger.parse_proc_stat(
        "cpu  1100 50 300 8150 150 10 40 700 0 0\ncpu0 1 1 1 1\ncpu1 1 1 1 1\n"
    )
    assert logger.host_shares(host, later) == pytest.approx((0.4, 0.1, 0.2))  # of 500 ticks
    assert logger.host_shares(host, host) == (None, None, None)  # no time between them
    with pytest.raises(ValueError, match="/proc/stat"):
        logger.parse_proc_stat("intr 1 2 3\n")


@pytest.mark.parametrize("comm", ["python3", "VLLM::EngineCor", "a) b (c", "x y"])
def test_a_process_stat_line_is_split_past_its_name(logger: ModuleType, comm: str) -> None:
    stat = logger.parse_pid_stat(pid_stat(4242, comm, 4000, 250, 50, 5288470))
    assert (stat.pid, stat.comm, stat.state, stat.pgrp) == (4242, comm, "R", 4000)
    assert (stat.cpu_ticks, stat.start_ticks) == (300, 5288470)
    with pytest.raises(ValueError, match="/proc/<pid>/stat"):
        logger.parse_pid_stat("4242 (cut short")


def test_context_switches_and_run_queue_wait_are_read_where_there(logger: ModuleType) -> None:
    assert logger.parse_switches(STATUS) == (1520, 87)
    assert logger.parse_switches("Name:\tx\nState:\tZ (zombie)\n") is None
    assert logger.parse_run_delay("473248 91000000 12\n") == 91000000
    assert logger.parse_run_delay("") is None and logger.parse_run_delay("1 x 2") is None


@pytest.mark.parametrize(
    ("cmdline", "comm", "pid", "name", "role"),
    [
        (b"VLLM::EngineCore\0\0\0\0", "VLLM::EngineCor", 11, "VLLM::EngineCore", "engine_core"),
        (b"VLLM::EngineCore_DP1  ", "python3", 11, "VLLM::EngineCore_DP1", "engine_core"),
        (b"VLLM::Worker_TP1\0", "python3", 12, "VLLM::Worker_TP1", "worker"),
        (b"VLLM::APIServer_0\0", "python3", 13, "VLLM::APIServer_0", "api_server"),
        (b"VLLM::DPCoordinator\0", "python3", 14, "VLLM::DPCoordinator", "coordinator"),
        (b"MYPREFIX::EngineCore\0", "python3", 11, "MYPREFIX::EngineCore", "engine_core"),
        # the group's leader: the process the scripts start, vLLM's API server
        (b"python3\0-m\0vllm.entrypoints.openai.api_server\0--model\0m\0", "python3", 10,
         "python3", "api_server"),
        (b"python3\0-c\0from multiprocessing.resource_tracker import main\0", "python3", 15,
         "python3", "other"),
        (b"", "kworker", 16, "kworker", "other"),
    ],
)  # fmt: skip
def test_vllms_process_titles_name_their_role(
    logger: ModuleType, cmdline: bytes, comm: str, pid: int, name: str, role: str
) -> None:
    found = logger.process_name(cmdline, comm)
    assert found == name
    assert logger.role_of(found, pid, leaders={10}) == role


def reading(logger: ModuleType, pid: int, ticks: int, start: int, switches: tuple[int, int] |
            None = (100, 10), delay: int | None = 0, name: str = "VLLM::EngineCore",
            role: str = "engine_core") -> object:  # fmt: skip
    stat = logger.ProcessStat(pid=pid, comm=name[:15], state="R", pgrp=10, cpu_ticks=ticks,
                              start_ticks=start)  # fmt: skip
    return logger.Reading(stat=stat, name=name, role=role, switches=switches,
                          run_delay_ns=delay)  # fmt: skip


def snapshot(logger: ModuleType, at_s: float, host: str, *readings: object) -> object:
    processes = {(r.stat.pid, r.stat.start_ticks): r for r in readings}  # type: ignore[attr-defined]
    return logger.Snapshot(at_s=at_s, host=logger.parse_proc_stat(host), processes=processes)


HOST_BEFORE = "cpu  1000 0 0 9000 0 0 0 0 0 0\ncpu0 1\ncpu1 1\n"
HOST_AFTER = "cpu  1100 0 20 9060 0 0 0 20 0 0\ncpu0 1\ncpu1 1\n"  # 200 ticks: 2 CPUs x 1 s


def test_two_readings_give_a_row_per_process_with_its_share_of_the_second(
    logger: ModuleType,
) -> None:
    tick = 100  # SC_CLK_TCK
    engine = reading(logger, 11, 5000, start=1000)
    api = reading(logger, 10, 700, start=900, name="python3", role="api_server",
                  switches=None, delay=None)  # fmt: skip
    gone = reading(logger, 12, 50, start=1000, name="VLLM::Worker", role="worker")
    old = reading(logger, 13, 400, start=1200, name="python3", role="other")  # not seen before
    new = reading(logger, 14, 30, start=100 * 20 + 50, name="python3", role="other")  # at 20.5 s
    before = snapshot(logger, 20.0, HOST_BEFORE, engine, api, gone)
    after = snapshot(
        logger, 21.0, HOST_AFTER,
        reading(logger, 11, 5095, start=1000, switches=(130, 25), delay=200_000_000),
        reading(logger, 10, 760, start=900, name="python3", role="api_server",
                switches=None, delay=None),
        old, new,
    )  # fmt: skip
    rows = logger.log_rows(before, after, "2026-12-01T02:46:49.025+00:00", tick)
    assert [r.pid for r in rows] == ["10", "11", "14"]  # 12 gone, 13 seen for the first time
    assert {r.utc for r in rows} == {"2026-12-01T02:46:49.025+00:00"}
    assert {(r.cpus, r.interval_s, r.host_busy, r.host_iowait, r.host_steal) for r in rows} == {
        ("2", "1.000", "0.6000", "0.0000", "0.1000")
    }
    api_row, engine_row, new_row = rows
    assert (engine_row.role, engine_row.name, engine_row.cpu) == (
        "engine_core", "VLLM::EngineCore", "0.9500")  # fmt: skip
    assert (engine_row.voluntary_per_s, engine_row.involuntary_per_s) == ("30.0", "15.0")
    assert engine_row.runqueue_wait == "0.2000"  # 0.2 s waiting for a CPU in 1 s
    assert (api_row.cpu, api_row.voluntary_per_s, api_row.runqueue_wait) == ("0.6000", "", "")
    assert new_row.cpu == "0.3000"  # started inside the second: all its time is in it


def test_without_processes_a_row_still_gives_the_host(logger: ModuleType) -> None:
    rows = logger.log_rows(snapshot(logger, 5.0, HOST_BEFORE), snapshot(logger, 6.0, HOST_AFTER),
                           "2026-12-01T00:00:00.000+00:00", 100)  # fmt: skip
    assert len(rows) == 1 and rows[0].pid == "" and rows[0].host_busy == "0.6000"
    assert tuple(rows[0]._fields) == logger.COLUMNS


@given(
    ticks=st.lists(st.integers(0, 10**6), min_size=2, max_size=2),
    pids=st.lists(st.integers(2, 60), max_size=8, unique=True),
    gap=st.floats(0.05, 5.0),
)
def test_a_row_is_written_only_for_a_process_seen_twice_or_born_between(
    logger: ModuleType, ticks: list[int], pids: list[int], gap: float
) -> None:
    """Whatever comes and goes: no negative share, no row without a baseline."""
    first = [reading(logger, p, ticks[0], start=p) for p in pids[::2]]
    second = [reading(logger, p, max(ticks), start=p) for p in pids]
    before = snapshot(logger, 1.0, HOST_BEFORE, *first)
    rows = logger.log_rows(before, snapshot(logger, 1.0 + gap, HOST_AFTER, *second), "t", 100)
    seen = {str(p) for p in pids[::2]}
    assert {r.pid for r in rows} - {""} == seen
    assert all(float(r.cpu) >= 0 for r in rows if r.pid)


def fake_proc(root: Path, processes: dict[int, dict[str, str | bytes]]) -> Path:
    root.mkdir()
    (root / "stat").write_text(PROC_STAT)
    (root / "self").mkdir()  # not a pid: passed over
    for pid, files in processes.items():
        folder = root / str(pid)
        folder.mkdir()
        for name, text in files.items():
            mode = "wb" if isinstance(text, bytes) else "w"
            with (folder / name).open(mode) as f:
                f.write(text)
    return root


def test_a_snapshot_reads_the_groups_processes_and_passes_over_what_vanished(
    logger: ModuleType, tmp_path: Path
) -> None:
    proc = fake_proc(
        tmp_path / "proc",
        {
            10: {"stat": pid_stat(10, "python3", 10, 300, 20, 900), "cmdline": b"python3\0-m\0x\0",
                 "status": STATUS, "schedstat": "1 2000 3\n"},
            11: {"stat": pid_stat(11, "VLLM::EngineCor", 10, 900, 90, 1000),
                 "cmdline": b"VLLM::EngineCore\0\0"},  # status and schedstat not readable
            12: {"stat": pid_stat(12, "bash", 12, 1, 1, 800), "cmdline": b"bash\0"},  # not ours
            13: {},  # gone between listing /proc and reading it
            14: {"stat": "14 (half"},  # torn: passed over
            15: {"stat": pid_stat(15, "python3", 10, 90, 1, 1000, state="Z")},  # exited
        },
    )  # fmt: skip
    snap = logger.read_snapshot(proc, {10}, at_s=12.5)
    assert snap.at_s == 12.5 and snap.host.cpus == 2
    assert sorted(snap.processes) == [(10, 900), (11, 1000)]
    api, engine = snap.processes[(10, 900)], snap.processes[(11, 1000)]
    assert (api.role, api.stat.cpu_ticks, api.switches, api.run_delay_ns) == (
        "api_server", 320, (1520, 87), 2000)  # fmt: skip
    assert (engine.role, engine.name, engine.switches, engine.run_delay_ns) == (
        "engine_core", "VLLM::EngineCore", None, None)  # fmt: skip
    assert logger.read_snapshot(proc, set(), at_s=1.0).processes == {}  # the host alone
