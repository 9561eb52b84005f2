"""bench/gpu/gc_log.py: vLLM's "GC took" lines (VLLM_GC_DEBUG=1) read and set beside windows:
only collections whose whole logged second lies inside a window count for it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.gpu_jobs import load_gpu_module

T0 = datetime(2026, 12, 1, 2, 44, 50, tzinfo=UTC)
# vLLM 0.26.0's format (vllm/utils/gc_utils.py through its logger), engine core prefix included
LINES = """\
(EngineCore pid=3142) INFO 12-01 02:44:57 [core.py:116] Initializing a V1 LLM engine
(EngineCore pid=3142) INFO 12-01 02:44:57 [gc_utils.py:80] GC took 0.412ms to complete. \
Collected 0 objects (out of 812) in GC generation 0.
(EngineCore pid=3142) INFO 12-01 02:44:58 [gc_utils.py:80] GC took 312.500ms to complete. \
Collected 1204 objects (out of 912345) in GC generation 2.
(EngineCore pid=3142) INFO 12-01 02:44:58 [gc_utils.py:80] GC took 1.088ms to complete. \
Collected 3 objects (out of 700) in GC generation 1. Top collected objects:
(APIServer pid=3048) INFO 12-01 02:45:01 [loggers.py:12] Engine 000: Avg prompt throughput
"""


@pytest.fixture(scope="module")
def gc() -> ModuleType:
    load_gpu_module("gpu_clocks")
    return load_gpu_module("gc_log")


def test_the_gc_lines_are_read_with_their_second_process_duration_and_generation(
    gc: ModuleType,
) -> None:
    collections = gc.read_gc_log(LINES, 2026, UTC)
    assert [(c.second, c.process, c.ms, c.generation) for c in collections] == [
        (T0 + timedelta(seconds=7), "EngineCore pid=3142", 0.412, 0),
        (T0 + timedelta(seconds=8), "EngineCore pid=3142", 312.5, 2),
        (T0 + timedelta(seconds=8), "EngineCore pid=3142", 1.088, 1),
    ]


def test_a_host_in_another_zone_is_brought_to_utc(gc: ModuleType) -> None:
    plus_one = gc.utc_offset("+0100")
    (first, *_) = gc.read_gc_log(LINES, 2026, plus_one)
    assert first.second == T0 + timedelta(seconds=7) - timedelta(hours=1)


def test_a_window_counts_the_seconds_wholly_inside_it(gc: ModuleType) -> None:
    collections = gc.read_gc_log(LINES, 2026, UTC)
    # [02:44:57.5, 02:45:00): the second 57 is not wholly inside, 58 is
    window = gc.window_gc(collections, T0 + timedelta(seconds=7.5), T0 + timedelta(seconds=10))
    assert window == {
        "collections": 2,
        "ms": 313.588,
        "ms_by_generation": {"1": 1.088, "2": 312.5},
        "longest_ms": 312.5,
        "share": round(0.313588 / 2.5, 4),
    }
    empty = gc.window_gc(collections, T0, T0 + timedelta(seconds=5))
    assert empty["collections"] == 0 and empty["longest_ms"] is None and empty["share"] == 0


@given(
    seconds=st.lists(st.integers(min_value=0, max_value=60), max_size=40),
    start_us=st.integers(min_value=0, max_value=60_000_000),
    length_us=st.integers(min_value=0, max_value=30_000_000),
)
def test_no_collection_is_counted_outside_its_window(
    gc: ModuleType, seconds: list[int], start_us: int, length_us: int
) -> None:
    # windows in whole microseconds, the resolution of the datetimes they are given as
    collections = [
        gc.Collection(T0 + timedelta(seconds=s), "EngineCore pid=1", 1.0, 0) for s in seconds
    ]
    begin = T0 + timedelta(microseconds=start_us)
    end = begin + timedelta(microseconds=length_us)
    counted = gc.window_gc(collections, begin, end)["collections"]
    second = 1_000_000
    wholly_inside = [
        s for s in seconds if start_us <= s * second and (s + 1) * second <= start_us + length_us
    ]
    assert counted == len(wholly_inside)


def test_a_runs_windows_get_their_collections_read_in_its_zone(gc: ModuleType) -> None:
    def stamp(s: float) -> str:
        return (T0 + timedelta(seconds=s)).isoformat(timespec="milliseconds")

    raw = {
        "meta": {"date": "2026-12-01T03:44:17+01:00", "gc_log": {"utc_offset": "+0100"}},
        "windows": [
            {"part": "p-arms", "arm": "k3", "started_utc": stamp(7.5), "ended_utc": stamp(10)},
            {"part": "p-arms", "arm": "k1", "started_utc": stamp(10), "ended_utc": stamp(14)},
        ],
    }
    # the log's local stamps an hour ahead of UTC: shifted, they fall where they did above
    local = LINES.replace(" 02:44:", " 03:44:").replace(" 02:45:", " 03:45:")
    assert gc.annotate(raw, gc.read_for_run(raw, local)) == {
        "aligned": "recorded",
        "collections": 3,
    }
    assert [w["gc"]["collections"] for w in raw["windows"]] == [2, 0]
    assert raw["windows"][0]["gc"]["longest_ms"] == 312.5
