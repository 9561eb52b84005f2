"""bench/gpu/host_load.py: the host's once-a-second CPU log (host_logger.py's CSV) read and set
beside windows: only seconds wholly inside a window count for it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.gpu_jobs import load_gpu_module

T0 = datetime(2026, 12, 1, 2, 46, 49, tzinfo=UTC)


@pytest.fixture(scope="module")
def host() -> ModuleType:
    load_gpu_module("gpu_clocks")
    load_gpu_module("host_logger")
    return load_gpu_module("host_load")


def header(host: ModuleType) -> str:
    return ",".join(host.COLUMNS) + "\n"


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat(timespec="milliseconds")


def rows(second: float, busy: float, steal: float, engine: float, api: float = 0.5,
         wait: str = "0.0100", involuntary: str = "40.0") -> str:  # fmt: skip
    """One second's lines: the API server (the group's leader) and the engine core."""
    common = f"{at(second)},1.000,16,{busy:.4f},0.0000,{steal:.4f}"
    return (f"{common},10,api_server,python3,{api:.4f},300.0,5.0,0.0010\n"
            f"{common},11,engine_core,VLLM::EngineCore,{engine:.4f},2.0,{involuntary},"
            f"{wait}\n")  # fmt: skip


def test_the_log_is_read_second_by_second_past_a_torn_last_line(host: ModuleType) -> None:
    text = (
        header(host)
        + f"{at(0)},1.002,16,0.1200,0.0010,0.0000,,,,,,,\n"  # before vLLM's group was there
        + rows(1, 0.15, 0.02, 1.01)
        + f"{at(2)},0.998,16,0.1300,0.0000,0.0300,11,engine_core,VLLM::EngineCore,0.9"  # torn
    )
    samples = host.read_host_load(text)
    assert [s.at for s in samples] == [T0, T0 + timedelta(seconds=1)]
    first, second = samples
    assert (first.interval_s, first.cpus, first.busy, first.iowait, first.steal) == (
        1.002, 16, 0.12, 0.001, 0.0)  # fmt: skip
    assert first.processes == ()
    api, engine = second.processes
    assert (api.role, api.cpu, api.voluntary_per_s) == ("api_server", 0.5, 300.0)
    assert (engine.pid, engine.name, engine.cpu) == (11, "VLLM::EngineCore", 1.01)
    assert (engine.involuntary_per_s, engine.runqueue_wait) == (40.0, 0.01)
    with pytest.raises(ValueError, match=r"not a host_load\.csv"):
        host.read_host_load("timestamp, index, clocks.current.sm [MHz]\n")


def test_a_window_gets_the_means_of_the_seconds_wholly_inside_it(host: ModuleType) -> None:
    text = header(host) + "".join(
        rows(s, busy=0.1 * s, steal=0.01 * s, engine=1.0 - 0.1 * s, api=0.2 + 0.1 * s,
             wait=f"{0.01 * s:.4f}", involuntary=f"{10.0 * s:.1f}")
        for s in range(1, 8)
    )  # fmt: skip
    samples = host.read_host_load(text)
    # [1.5, 5.2]: the seconds ending at 3, 4 and 5 lie inside; 2 begins before, 6 ends after
    window = host.window_host(samples, T0 + timedelta(seconds=1.5), T0 + timedelta(seconds=5.2))
    assert window == {
        "samples": 3,
        "busy_share": 0.4,
        "iowait_share": 0.0,
        "steal_share": 0.04,
        "engine_core_cpu": 0.6,
        "engine_core_runqueue_wait": 0.04,
        "engine_core_voluntary_per_s": 2.0,
        "engine_core_involuntary_per_s": 40.0,
        "api_server_cpu": 0.6,
    }
    assert host.window_host(samples, T0, T0 + timedelta(seconds=0.9)) is None
    no_engine = [s for s in samples if s.at != T0]  # and the engine core absent from one second
    lone = host.HostSample(T0 + timedelta(seconds=9), 1.0, 16, 0.5, 0.0, 0.0, ())
    window = host.window_host([*no_engine, lone], T0 + timedelta(seconds=7.9),
                              T0 + timedelta(seconds=9.0))  # fmt: skip
    assert window["samples"] == 1 and window["engine_core_cpu"] is None


@given(
    ends=st.lists(st.floats(0.0, 60.0), min_size=1, max_size=40),
    lengths=st.lists(st.floats(0.1, 2.0), min_size=40, max_size=40),
    start=st.floats(-5.0, 60.0),
    width=st.floats(0.0, 20.0),
)
def test_a_sample_is_joined_to_a_window_only_when_its_whole_interval_lies_inside(
    host: ModuleType, ends: list[float], lengths: list[float], start: float, width: float
) -> None:
    samples = [host.HostSample(T0 + timedelta(seconds=e), length, 16, 0.1, 0.0, 0.0, ())
               for e, length in zip(ends, lengths, strict=False)]  # fmt: skip
    begin, end = T0 + timedelta(seconds=start), T0 + timedelta(seconds=start + width)
    joined = host.inside(samples, begin, end)
    for s in samples:
        wholly = begin <= s.at - timedelta(seconds=s.interval_s) and s.at <= end
        assert (s in joined) == wholly
    window = host.window_host(samples, begin, end)
    assert (window or {"samples": 0})["samples"] == len(joined)


def run(windows: list[dict]) -> dict:
    return {"meta": {}, "windows": windows, "durations_s": {}}


def test_windows_are_annotated_by_their_recorded_times(host: ModuleType) -> None:
    samples = host.read_host_load(header(host) + "".join(rows(s, 0.1, 0.0, 1.0)
                                                         for s in range(1, 10)))  # fmt: skip
    windows = [
        {"part": "B8-arms", "arm": arm, "started_utc": at(a), "ended_utc": at(b)}
        for arm, a, b in (("k1", 0.5, 4.5), ("k3", 5.0, 9.0), ("k2", 20.0, 24.0))
    ]
    how = host.annotate(run(windows), samples)
    assert how == {"aligned": "recorded", "samples": 9, "roles": ["api_server", "engine_core"],
                   "cpus": 16}  # fmt: skip
    assert [w["host"]["samples"] for w in windows] == [3, 4, 0]
    assert windows[0]["host"]["engine_core_cpu"] == 1.0
