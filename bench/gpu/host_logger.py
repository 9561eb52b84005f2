"""The host's CPU once a second beside the GPUs' log (live_step_time.sh, two_gpus.sh), so a
window where the GPU waits can be told apart: the engine core busy on its own work (a Python GC
pause, say: its CPU stays up, nothing waits), CPU contention inside the VM (its main thread
waits in the run queue, involuntary context switches) or the hypervisor taking the CPUs away
(steal). Standard library only: the GPU host has python3 and few packages.

    python3 bench/gpu/host_logger.py --out host_load.csv [--pgid PID ...] [--interval-s 1]

Each interval, one CSV row per process of the process groups named (vLLM's: the scripts start it
with setsid, so its group id is the PID they keep), each with the host's figures too; one row of
the host alone while none is there. Columns (``LogRow``): the UTC time at the interval's end,
its length, the CPUs in /proc/stat, the host's busy (user, nice, system, irq, softirq), iowait
and steal shares of all CPUs; per process its pid, role (``role_of``: vLLM's setproctitle
titles, ``VLLM::EngineCore`` and the like, or the group's leader: the API server), name, CPU
used (utime + stime of all its threads, in CPUs: 1.0 is one CPU all the time) and, where
readable, its main thread's context switches per second (voluntary, involuntary) and share of
the time it waited for a CPU while runnable (/proc/<pid>/schedstat). A process gets a row once
it has a baseline: seen at the interval's start, or born inside it.

Stops on SIGTERM or SIGINT (blocked, and waited for between samples, so a row is never cut):
writes the last partial interval, flushes and exits 0; also when the process that started it is
gone. Every row is flushed as written. Reads /proc only: never signals anything.
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

STOP = {signal.SIGTERM, signal.SIGINT}
EXITED = ("Z", "X")  # /proc/<pid>/stat states of a process that has ended
TITLE_MARK = "::"  # vLLM's titles: f"{VLLM_PROCESS_NAME_PREFIX}::{name}" (default prefix VLLM)
ROLES = (  # title after the mark -> role (vllm/v1/engine/core.py, executor, utils, coordinator)
    ("EngineCore", "engine_core"),
    ("Worker", "worker"),
    ("APIServer", "api_server"),
    ("DPCoordinator", "coordinator"),
)


class LogRow(NamedTuple):
    """One CSV row, as written (strings; empty where not known)."""

    utc: str
    interval_s: str
    cpus: str
    host_busy: str
    host_iowait: str
    host_steal: str
    pid: str
    role: str
    name: str
    cpu: str
    voluntary_per_s: str
    involuntary_per_s: str
    runqueue_wait: str


COLUMNS = LogRow._fields


@dataclass(frozen=True)
class HostTimes:
    """/proc/stat's all-CPU line in clock ticks since boot, and the CPUs it adds up."""

    busy: int
    iowait: int
    steal: int
    total: int
    cpus: int


@dataclass(frozen=True)
class ProcessStat:
    """What /proc/<pid>/stat says of a process (CPU of all its threads)."""

    pid: int
    comm: str
    state: str  # R, S, D, ...; Z: exited, not yet reaped
    pgrp: int
    cpu_ticks: int  # utime + stime
    start_ticks: int  # since boot


@dataclass(frozen=True)
class Reading:
    stat: ProcessStat
    name: str
    role: str
    switches: tuple[int, int] | None  # voluntary, involuntary
    run_delay_ns: int | None


@dataclass(frozen=True)
class Snapshot:
    at_s: float  # CLOCK_BOOTTIME: the clock processes' start times are counted on
    host: HostTimes
    processes: dict[tuple[int, int], Reading]  # by (pid, start ticks): a reused pid differs


def parse_proc_stat(text: str) -> HostTimes:
    """/proc/stat -> the all-CPU line's busy, iowait, steal and total ticks, and the CPUs."""
    lines = text.splitlines()
    fields = next((line.split() for line in lines if line.startswith("cpu ")), None)
    if fields is None or len(fields) < 9:
        raise ValueError("/proc/stat: no all-CPU line with steal time")
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    busy = user + nice + system + irq + softirq  # guest time is inside user already
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return HostTimes(busy, iowait, steal, busy + idle + iowait + steal, cpus)


def host_shares(before: HostTimes, after: HostTimes) -> tuple[float | None, ...]:
    """(busy, iowait, steal) as shares of all CPUs' time between two readings; Nones when no
    tick passed."""
    total = after.total - before.total
    if total <= 0:
        return (None, None, None)
    return tuple(
        (getattr(after, name) - getattr(before, name)) / total
        for name in ("busy", "iowait", "steal")
    )


def parse_pid_stat(text: str) -> ProcessStat:
    """/proc/<pid>/stat; the name is between the first '(' and the last ')' (it may hold
    either, or spaces)."""
    head, close, rest = text.rpartition(")")
    pid_text, _, comm = head.partition(" (")
    fields = rest.split()
    if not close or not pid_text.isdigit() or len(fields) < 20:
        raise ValueError(f"/proc/<pid>/stat: not a stat line: {text[:60]!r}")
    # fields[0] is field 3 (state): pgrp is 5, utime 14, stime 15, starttime 22
    return ProcessStat(int(pid_text), comm, fields[0], int(fields[2]),
                       int(fields[11]) + int(fields[12]), int(fields[19]))  # fmt: skip


def parse_switches(text: str) -> tuple[int, int] | None:
    """/proc/<pid>/status's voluntary and involuntary context switches (its main thread's)."""
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
            found[key] = int(value)
    if len(found) < 2:
        return None
    return found["voluntary_ctxt_switches"], found["nonvoluntary_ctxt_switches"]


def parse_run_delay(text: str) -> int | None:
    """/proc/<pid>/schedstat's second field: ns the main thread waited runnable for a CPU."""
    fields = text.split()
    return int(fields[1]) if len(fields) >= 2 and fields[1].isdigit() else None


def process_name(cmdline: bytes, comm: str) -> str:
    """vLLM's process title (setproctitle writes it over the command line) where there is one,
    else the process's own name."""
    first = cmdline.split(b"\0", 1)[0].decode(errors="replace").strip()
    return first if TITLE_MARK in first else comm


def role_of(name: str, pid: int, leaders: set[int]) -> str:
    """engine_core, worker, api_server, coordinator (vLLM's titles), api_server for a group's
    leader (the scripts start vLLM's API server with setsid), else other."""
    if TITLE_MARK in name:
        title = name.rsplit(TITLE_MARK, 1)[1]
        return next((role for start, role in ROLES if title.startswith(start)), "other")
    return "api_server" if pid in leaders else "other"


def read_file(path: str) -> bytes | None:
    """A /proc file's bytes (os.read: the logger reads every process's stat each second, and
    Python's file objects cost 3x more); None when it is gone or not ours to read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 1 << 16)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_process(folder: str, pgids: set[int]) -> Reading | None:
    """The process in ``folder`` when it belongs to one of ``pgids`` and is still running."""
    raw = read_file(f"{folder}/stat")
    if raw is None:
        return None
    try:
        stat = parse_pid_stat(raw.decode(errors="replace"))
    except ValueError:
        return None
    if stat.pgrp not in pgids or stat.state in EXITED:
        return None
    name = process_name(read_file(f"{folder}/cmdline") or b"", stat.comm)
    status, schedstat = read_file(f"{folder}/status"), read_file(f"{folder}/schedstat")
    return Reading(
        stat,
        name,
        role_of(name, stat.pid, pgids),
        parse_switches(status.decode(errors="replace")) if status else None,
        parse_run_delay(schedstat.decode()) if schedstat else None,
    )


def read_snapshot(proc: Path, pgids: set[int], at_s: float) -> Snapshot:
    """The host's CPU ticks and every process of ``pgids`` under ``proc`` (/proc)."""
    host = parse_proc_stat((proc / "stat").read_text())
    processes = {}
    if pgids:
        for name in os.listdir(proc):
            if name.isdigit():
                found = read_process(f"{proc}/{name}", pgids)
                if found is not None:
                    processes[(found.stat.pid, found.stat.start_ticks)] = found
    return Snapshot(at_s, host, processes)


def share(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def per_second(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def log_rows(before: Snapshot, after: Snapshot, utc: str, tick_hz: int) -> list[LogRow]:
    """The rows of the interval between two snapshots: one per process with a baseline (in
    ``before``, or started after it: then everything it counted is in the interval), sorted by
    pid; the host alone when there is none."""
    elapsed = after.at_s - before.at_s
    busy, iowait, steal = host_shares(before.host, after.host)
    host = (utc, f"{elapsed:.3f}", str(after.host.cpus), share(busy), share(iowait), share(steal))
    rows = []
    for key, now in sorted(after.processes.items()):
        then = before.processes.get(key)
        if then is None and now.stat.start_ticks / tick_hz < before.at_s:
            continue  # seen for the first time: the next interval has its baseline
        cpu = now.stat.cpu_ticks - (then.stat.cpu_ticks if then else 0)
        switches = [None, None]
        if now.switches is not None and (then is None or then.switches is not None):
            earlier = then.switches if then else (0, 0)
            switches = [(n - e) / elapsed for n, e in zip(now.switches, earlier, strict=True)]
        waited = None
        if now.run_delay_ns is not None and (then is None or then.run_delay_ns is not None):
            waited = (now.run_delay_ns - (then.run_delay_ns if then else 0)) / 1e9 / elapsed
        rows.append(LogRow(*host, str(now.stat.pid), now.role, now.name,
                           share(cpu / tick_hz / elapsed), per_second(switches[0]),
                           per_second(switches[1]), share(waited)))  # fmt: skip
    return rows or [LogRow(*host, "", "", "", "", "", "", "")]


def now_utc() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def boot_clock() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def run(out: Path, pgids: set[int], interval_s: float, proc: Path = Path("/proc")) -> None:
    """Log until SIGTERM/SIGINT or until the process that started this one is gone."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP)
    parent, tick_hz = os.getppid(), os.sysconf("SC_CLK_TCK")
    with out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        f.flush()
        before = read_snapshot(proc, pgids, boot_clock())
        due = time.monotonic() + interval_s
        stopping = False
        while not stopping:
            wait = max(0.0, due - time.monotonic())
            stopping = signal.sigtimedwait(STOP, wait) is not None or os.getppid() != parent
            after = read_snapshot(proc, pgids, boot_clock())
            if after.at_s - before.at_s >= 0.05:  # a stop just after a sample: nothing to add
                writer.writerows(log_rows(before, after, now_utc(), tick_hz))
                f.flush()
                before = after
            due += interval_s
            if due < time.monotonic():  # fell behind (a slow /proc, a suspended VM): no burst
                due = time.monotonic() + interval_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the CSV to write (replaced)")
    parser.add_argument("--pgid", type=int, action="append", default=[],
                        help="a process group to log process by process (repeatable)")  # fmt: skip
    parser.add_argument("--interval-s", type=float, default=1.0)
    args = parser.parse_args(argv)
    if not 0.05 <= args.interval_s <= 60:
        parser.error(f"--interval-s must be within 0.05..60, got {args.interval_s}")
    if any(pgid < 1 for pgid in args.pgid):
        parser.error(f"--pgid must be a positive process group id, got {args.pgid}")
    run(Path(args.out), set(args.pgid), args.interval_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
