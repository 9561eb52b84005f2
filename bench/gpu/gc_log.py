"""Garbage collections in vLLM's processes set beside measurement windows: with
``VLLM_GC_DEBUG=1`` vLLM 0.26.0 logs each collection in the engine core (and its workers) with
its duration and generation (``vllm/utils/gc_utils.py``: "GC took 12.345ms to complete.
Collected N objects (out of M) in GC generation G."). live_step_time.sh keeps those lines as
gc_log.txt when run with ``GC_DEBUG=1`` (meta.gc_log); eval_traffic_report.py joins them to the
windows. Per window: how many collections, their milliseconds in all and per generation, the
longest, and the share of the window they took, to tell a stall of the engine core's garbage
collector from one of the host (host_load.py).

vLLM stamps its lines to the second in the host's local time without a year: a collection
counts for a window when its whole logged second lies inside the window, the year from the
run's date and the offset from UTC from meta.gc_log (as ``date +%z`` gave it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from gpu_clocks import utc_offset, window_spans

Row = dict[str, Any]
LINE = re.compile(
    r"^\((?P<process>[^)]*)\)\s+\w+\s+(?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d)\s+\[[^\]]*\]\s+"
    r"GC took (?P<ms>[0-9.]+)ms to complete\..*?in GC generation (?P<generation>\d)"
)
SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class Collection:
    """One collection as vLLM logged it."""

    second: datetime  # the logged second's start, in UTC
    process: str  # vLLM's prefix, e.g. "EngineCore pid=3142"
    ms: float
    generation: int


def read_gc_log(text: str, year: int, offset: timezone) -> list[Collection]:
    """The "GC took" lines of a vLLM log (others ignored)."""
    collections = []
    for line in text.splitlines():
        found = LINE.search(line)
        if found is None:
            continue
        local = datetime.strptime(f"{year}-{found['stamp']}", "%Y-%m-%d %H:%M:%S")
        collections.append(
            Collection(
                second=local.replace(tzinfo=offset).astimezone(UTC),
                process=found["process"].strip(),
                ms=float(found["ms"]),
                generation=int(found["generation"]),
            )
        )
    return collections


def window_gc(collections: list[Collection], start: datetime, end: datetime) -> Row:
    """The collections whose logged second lies wholly inside [start, end)."""
    inside = [c for c in collections if c.second >= start and c.second + SECOND <= end]
    total = sum(c.ms for c in inside)
    per_generation: dict[str, float] = {}
    for c in inside:
        per_generation[str(c.generation)] = per_generation.get(str(c.generation), 0.0) + c.ms
    seconds = max(0.0, (end - start).total_seconds())
    return {
        "collections": len(inside),
        "ms": round(total, 3),
        "ms_by_generation": {g: round(ms, 3) for g, ms in sorted(per_generation.items())},
        "longest_ms": max((c.ms for c in inside), default=None),
        "share": round(total / 1000 / seconds, 4) if seconds else None,
    }


def annotate(raw: Row, collections: list[Collection]) -> Row:
    """Each window of ``raw`` gets ``gc`` in place; returns how they were aligned and the
    collections read."""
    spans, aligned, _ = window_spans(raw)
    for w, (start, end) in zip(raw["windows"], spans, strict=True):
        w["gc"] = window_gc(collections, start, end)
    return {"aligned": aligned, "collections": len(collections)}


def read_for_run(raw: Row, text: str) -> list[Collection]:
    """The collections of a run's gc_log.txt, its stamps read with the run's year and offset."""
    meta = raw["meta"]
    year = datetime.fromisoformat(meta["date"]).year
    return read_gc_log(
        text, year, utc_offset((meta.get("gc_log") or {}).get("utc_offset") or "+0000")
    )
