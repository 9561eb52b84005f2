"""The host's once-a-second CPU log (host_logger.py's host_load.csv, written by
live_step_time.sh beside gpu_clocks.csv) set beside measurement windows: per window the host's
busy, iowait and steal shares and, for vLLM's processes, the engine core's CPU, its main
thread's run-queue wait and context switches, and the API server's CPU. With the
GPU's busy share (gpu_clocks.py) it tells a window where the GPU waited on the host apart by
cause: the engine core busy on its own work (CPU up, no wait, no steal), waiting on something
else (CPU down, voluntary switches up), contention inside the VM (run-queue wait, involuntary
switches) or the hypervisor (steal).

A sample covers the interval before its time; it counts for a window only when that whole
interval lies inside the window (a 4 s window gets 3 or 4 one-second samples). Windows are
placed as gpu_clocks.py places them (recorded times, or the rebuilt schedule).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpu_clocks import mean_of, number, window_spans
from host_logger import COLUMNS, LogRow

Row = dict[str, Any]
ENGINE_CORE, API_SERVER = "engine_core", "api_server"  # host_logger.role_of's roles


@dataclass(frozen=True)
class ProcessLoad:
    """One process of vLLM's group over one interval."""

    pid: int
    role: str
    name: str
    cpu: float | None  # CPUs used: 1.0 is one CPU all the time
    voluntary_per_s: float | None
    involuntary_per_s: float | None
    runqueue_wait: float | None  # share of the interval its main thread waited for a CPU


@dataclass(frozen=True)
class HostSample:
    """One interval of the log: the host's shares of all CPUs and vLLM's processes."""

    at: datetime  # the interval's end
    interval_s: float
    cpus: int
    busy: float | None
    iowait: float | None
    steal: float | None
    processes: tuple[ProcessLoad, ...]

    @property
    def started(self) -> datetime:
        return self.at - timedelta(seconds=self.interval_s)

    def role_total(self, role: str, field: str) -> float | None:
        """``field`` summed over the processes of ``role`` (None: none of them reported it)."""
        values = [getattr(p, field) for p in self.processes if p.role == role]
        present = [v for v in values if v is not None]
        return sum(present) if present else None


def process_of(row: LogRow) -> ProcessLoad:
    return ProcessLoad(int(row.pid), row.role, row.name, number(row.cpu),
                       number(row.voluntary_per_s), number(row.involuntary_per_s),
                       number(row.runqueue_wait))  # fmt: skip


def read_host_load(text: str) -> list[HostSample]:
    """The log's samples in order; a line cut short (the logger killed mid-write) or not
    parsed is passed over; ValueError when the header is not the logger's."""
    lines = csv.reader(io.StringIO(text))
    head = next(lines, [])
    if tuple(head) != COLUMNS:
        raise ValueError(f"not a host_load.csv (header {','.join(head)[:60]!r})")
    groups: dict[str, list[LogRow]] = {}
    for fields in lines:
        if len(fields) == len(COLUMNS):
            row = LogRow(*fields)
            groups.setdefault(row.utc, []).append(row)
    samples = []
    for utc, group in groups.items():
        first = group[0]
        try:
            at, interval = datetime.fromisoformat(utc), float(first.interval_s)
            cpus = int(first.cpus)
            processes = tuple(process_of(row) for row in group if row.pid)
        except ValueError:
            continue
        samples.append(HostSample(at, interval, cpus, number(first.host_busy),
                                  number(first.host_iowait), number(first.host_steal),
                                  processes))  # fmt: skip
    return samples


def inside(samples: list[HostSample], start: datetime, end: datetime) -> list[HostSample]:
    """The samples whose whole interval lies in [start, end]."""
    return [s for s in samples if start <= s.started and s.at <= end]


def window_host(samples: list[HostSample], start: datetime, end: datetime) -> Row | None:
    """Means over the samples inside [start, end]; None when none is."""
    held = inside(samples, start, end)
    if not held:
        return None
    return {
        "samples": len(held),
        "busy_share": mean_of([s.busy for s in held], 3),
        "iowait_share": mean_of([s.iowait for s in held], 3),
        "steal_share": mean_of([s.steal for s in held], 3),
        "engine_core_cpu": mean_of([s.role_total(ENGINE_CORE, "cpu") for s in held], 3),
        "engine_core_runqueue_wait": mean_of(
            [s.role_total(ENGINE_CORE, "runqueue_wait") for s in held], 3
        ),
        "engine_core_voluntary_per_s": mean_of(
            [s.role_total(ENGINE_CORE, "voluntary_per_s") for s in held]
        ),
        "engine_core_involuntary_per_s": mean_of(
            [s.role_total(ENGINE_CORE, "involuntary_per_s") for s in held]
        ),
        "api_server_cpu": mean_of([s.role_total(API_SERVER, "cpu") for s in held], 3),
    }


def annotate(raw: Row, samples: list[HostSample]) -> Row:
    """Each window of ``raw`` gets ``host`` in place (``samples`` 0: none inside); returns how
    they were aligned, the samples read, the roles seen and the host's CPUs."""
    spans, aligned, _ = window_spans(raw)
    for w, (start, end) in zip(raw["windows"], spans, strict=True):
        w["host"] = window_host(samples, start, end) or {"samples": 0}
    return {
        "aligned": aligned,
        "samples": len(samples),
        "roles": sorted({p.role for s in samples for p in s.processes}),
        "cpus": max((s.cpus for s in samples), default=None),
    }
