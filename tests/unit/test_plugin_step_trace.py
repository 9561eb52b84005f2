"""The evaluation-only step trace: its lines, its file, and the engine glue writing it."""

from __future__ import annotations

import io
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.plugin import engine, step_trace
from tabletune.plugin.step_trace import (
    FLUSH_EVERY,
    HEADER,
    StepTrace,
    open_trace_from_env,
    trace_line,
    trace_path,
)

from .test_plugin_engine_glue import clocked_scheduler


def test_a_line_says_what_the_step_scheduled() -> None:
    scheduled = {"a": 4, "b": 3, "c": 57}  # a at k=3, b at k=2, c a prompt's chunk
    spec = {"a": [1, 2, 3], "b": [1, 2]}
    line = trace_line(
        12.5, scheduled, 64, spec,
        new_requests=1, finished_requests=2, idle_after=False, drafts_next=1,
    )  # fmt: skip
    assert line == "12.500000,3,3,5,64,1,2,0,1\n"
    fields = HEADER.strip().split(",")
    assert dict(zip(fields, line.strip().split(","), strict=True))["draft_tokens"] == "5"


@given(
    drafts=st.lists(st.integers(0, 7), max_size=40),
    new=st.integers(0, 300),
    idle=st.booleans(),
)
def test_every_line_has_the_headers_fields_and_k_is_the_longest_draft(
    drafts: list[int], new: int, idle: bool
) -> None:
    scheduled = {f"r{i}": 1 + d for i, d in enumerate(drafts)}
    spec = {f"r{i}": [0] * d for i, d in enumerate(drafts) if d}
    line = trace_line(
        1.0, scheduled, sum(scheduled.values()), spec,
        new_requests=new, finished_requests=0, idle_after=idle, drafts_next=2,
    )  # fmt: skip
    values = line.rstrip("\n").split(",")
    assert line.endswith("\n") and len(values) == len(HEADER.split(","))
    assert int(values[1]) == len(drafts) and int(values[2]) == max(drafts, default=0)
    assert int(values[3]) == sum(drafts) and int(values[7]) == int(idle)
    assert int(values[8]) == 2


def test_lines_are_buffered_and_flushed_every_so_many() -> None:
    class Counting(io.StringIO):
        flushes = 0

        def flush(self) -> None:
            self.flushes += 1

    stream = Counting()
    trace = StepTrace(stream)
    for _ in range(FLUSH_EVERY - 1):
        trace.write("x\n")
    assert stream.flushes == 0
    trace.write("x\n")
    assert stream.flushes == 1 and stream.getvalue().startswith(HEADER)


def test_the_file_is_named_by_prefix_and_pid_and_never_overwritten(tmp_path: Path) -> None:
    assert open_trace_from_env({}) is None
    assert open_trace_from_env({step_trace.TRACE_ENV: ""}) is None
    prefix = str(tmp_path / "trace")
    trace = open_trace_from_env({step_trace.TRACE_ENV: prefix})
    assert trace is not None
    trace.flush()
    path = Path(trace_path(prefix, os.getpid()))
    assert path.read_text() == HEADER
    with pytest.raises(FileExistsError):
        open_trace_from_env({step_trace.TRACE_ENV: prefix})
    with pytest.raises(ValueError, match="file prefix"):
        trace_path("  ", 1)


def traced_output(batch: int, k: int, *, new: int) -> Any:
    ids = [f"r{i}" for i in range(batch)]
    return SimpleNamespace(
        num_scheduled_tokens=dict.fromkeys(ids, 1 + k),
        total_num_scheduled_tokens=batch * (1 + k),
        scheduled_spec_decode_tokens={i: [-1] * k for i in ids} if k else {},
        scheduled_new_reqs=[object()] * new,
        finished_req_ids=set(),
        num_spec_tokens_to_schedule=k,
    )


def test_the_engine_writes_a_line_per_step_when_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(step_trace.TRACE_ENV, str(tmp_path / "t"))
    scheduler, clock = clocked_scheduler(monkeypatch)
    engine.step_timer_of(scheduler).set_enabled(False)  # the trace does not need the cells
    for new in (0, 2, 0):
        scheduler.update_from_output(traced_output(8, 2, new=new), None)
        clock[0] += 0.019
    trace = engine.step_trace_of(scheduler)
    assert trace is not None
    trace.flush()
    lines = Path(trace_path(str(tmp_path / "t"), os.getpid())).read_text().splitlines()
    assert lines[0] == HEADER.strip() and len(lines) == 4
    assert [line.split(",")[5] for line in lines[1:]] == ["0", "2", "0"]
    assert {line.split(",")[8] for line in lines[1:]} == {"2"}
    assert scheduler.calls == 3


def test_without_the_environment_no_trace_is_opened(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(step_trace.TRACE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    scheduler, _ = clocked_scheduler(monkeypatch)
    scheduler.update_from_output(traced_output(4, 1, new=0), None)
    assert engine.step_trace_of(scheduler) is None and list(tmp_path.iterdir()) == []


def test_a_trace_that_cannot_open_leaves_the_engine_running(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(step_trace.TRACE_ENV, str(tmp_path / "missing-dir" / "t"))
    scheduler, clock = clocked_scheduler(monkeypatch)
    for _ in range(3):
        scheduler.update_from_output(traced_output(4, 1, new=0), None)
        clock[0] += 0.019
    assert engine.step_trace_of(scheduler) is None
    assert engine.step_timer_of(scheduler).counter.totals()[(1, 4, 4)].steps == 2
