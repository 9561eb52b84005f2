"""A per-step trace of the engine, for evaluations only: off unless ``TABLETUNE_STEP_TRACE``
names a file prefix. The step cells are sums; some questions need the steps themselves (does a
step that takes a prompt in cost per prompt it takes, or once?), so the engine core then also
writes one CSV line per scheduler step to ``<prefix>.<pid>.csv``.

A line holds what ``StepTimer`` reads and what it does not: the wall time the step's results
were ready (``time.time()``, so lines line up with an evaluation's UTC windows; a step's
duration is the gap to the line before it, as the timer counts it), the batch size, the k it
verified, the draft tokens scheduled, all scheduled tokens, the requests new to the engine
(``scheduled_new_reqs``: their first prefill chunk), the requests that finished, and whether
the scheduler was left idle, and the drafts it made for the next step (the lookup's k when it
was scheduled: what its time follows most, step_timer.py). Writes are buffered (a line is a
few microseconds of the engine thread); the last lines before a hard kill may be lost.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TextIO

TRACE_ENV = "TABLETUNE_STEP_TRACE"
HEADER = (
    "time_s,batch,k,draft_tokens,tokens,new_requests,finished_requests,idle_after,drafts_next\n"
)
FLUSH_EVERY = 256


def trace_line(
    wall_s: float,
    num_scheduled_tokens: Mapping[str, int],
    total_tokens: int,
    spec_tokens: Mapping[str, Sequence[int]],
    *,
    new_requests: int,
    finished_requests: int,
    idle_after: bool,
    drafts_next: int,
) -> str:
    """One step's CSV line (``HEADER``'s fields, newline-terminated)."""
    drafts = list(map(len, spec_tokens.values()))
    k = max(drafts) if drafts else 0
    return (
        f"{wall_s:.6f},{len(num_scheduled_tokens)},{k},{sum(drafts)},{total_tokens},"
        f"{new_requests},{finished_requests},{int(idle_after)},{drafts_next}\n"
    )


class StepTrace:
    """Buffered trace lines to one stream; the header first."""

    __slots__ = ("_pending", "_stream")

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._stream.write(HEADER)
        self._pending = 0

    def write(self, line: str) -> None:
        self._stream.write(line)
        self._pending += 1
        if self._pending >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        self._stream.flush()
        self._pending = 0


def trace_path(prefix: str, pid: int) -> str:
    """This process's trace file: the prefix (a directory must exist) and the pid."""
    if not prefix.strip():
        raise ValueError(f"{TRACE_ENV} must name a file prefix, got {prefix!r}")
    return f"{prefix}.{pid}.csv"


def open_trace_from_env(environ: Mapping[str, str] | None = None) -> StepTrace | None:
    """The trace ``TABLETUNE_STEP_TRACE`` asks for (None when unset or empty)."""
    prefix = (os.environ if environ is None else environ).get(TRACE_ENV, "")
    if not prefix:
        return None
    return StepTrace(open(trace_path(prefix, os.getpid()), "x", encoding="ascii"))
