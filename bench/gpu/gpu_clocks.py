"""The GPUs' once-a-second log (nvidia-smi, live_step_time.sh's and two_gpus.sh's
gpu_clocks.csv) set beside measurement windows: each window's mean SM clock, utilization and
power and the throttle reasons seen inside it, so a slow window can be told from a throttled or
idle GPU.

Windows that recorded when they ran (``started_utc``/``ended_utc``) are aligned exactly. Older
runs' rows carry no times: ``reconstructed_spans`` rebuilds them from the driver's schedule
(the engine ready at meta.date + meta.startup_s; each part starts where the one before ended;
warm-up, the daemon's windows back to back, each arm's window after its settle and, for the
Nightjar-style arm, its learning); those are marked approximate.
"""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

Row = dict[str, Any]
NIGHTJAR = "nightjar"
DEFAULT_WARMUP_S = 6.0  # eval_traffic.py's --warmup-s, for runs that did not record theirs
# nvidia-smi's clocks_event_reasons bits (nvml.h, nvmlClocksEventReason*).
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


@dataclass(frozen=True)
class Sample:
    """One GPU's line of the log."""

    at: datetime
    index: int
    sm_mhz: float | None
    power_w: float | None
    utilization_pct: float | None
    reasons: int | None


def utc_offset(text: str) -> timezone:
    """``date +%z``'s ``+0100`` -> that zone (nvidia-smi writes the host's local time)."""
    sign, digits = (-1 if text[:1] == "-" else 1), text[1:]
    if text[:1] not in ("+", "-") or len(digits) != 4 or not digits.isdigit():
        raise ValueError(f"UTC offset {text!r}: +HHMM or -HHMM")
    return timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))


def number(field: str) -> float | None:
    """``1980 MHz``, ``78.24 W``, ``0 %`` -> the number; ``[N/A]`` and the like -> None."""
    try:
        return float(field.split()[0])
    except (IndexError, ValueError):
        return None


def read_clocks(text: str, offset: str = "+0000") -> list[Sample]:
    """The log's samples, in the column order both scripts query (timestamp, index, SM clock,
    memory clock, power, temperature, utilization, throttle reasons); header lines and lines
    nvidia-smi wrote instead of samples are passed over."""
    zone = utc_offset(offset)
    samples = []
    for fields in csv.reader(io.StringIO(text), skipinitialspace=True):
        if len(fields) != 8:
            continue
        try:
            at = datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=zone)
            index = int(fields[1])
        except ValueError:
            continue
        try:
            reasons: int | None = int(fields[7], 16)
        except ValueError:
            reasons = None
        samples.append(Sample(at, index, number(fields[2]), number(fields[4]),
                              number(fields[6]), reasons))  # fmt: skip
    return samples


def job_gpus(text: str | None) -> set[int] | None:
    """CUDA_VISIBLE_DEVICES as the job saw it -> the GPU indices to read; None (every GPU's)
    when unset or not plain indices (UUIDs)."""
    if not text:
        return None
    items = [item.strip() for item in text.split(",")]
    return {int(item) for item in items} if all(i.isdigit() for i in items) else None


def mean_of(values: list[float | None], digits: int = 1) -> float | None:
    """The mean of the values present, rounded; None when none is."""
    present = [v for v in values if v is not None]
    return round(statistics.fmean(present), digits) if present else None


def window_gpu(samples: list[Sample], start: datetime, end: datetime,
               gpus: set[int] | None) -> Row | None:  # fmt: skip
    """The samples of ``gpus`` taken inside [start, end]: their means and the share of them
    with each throttle reason; None when none fell inside."""
    inside = [s for s in samples
              if start <= s.at <= end and (gpus is None or s.index in gpus)]  # fmt: skip
    if not inside:
        return None
    reasons = [s.reasons for s in inside if s.reasons is not None]
    shares = {
        name: round(sum(1 for r in reasons if r & bit) / len(reasons), 2)
        for bit, name in THROTTLE_REASONS.items()
        if any(r & bit for r in reasons)
    }
    return {
        "samples": len(inside),
        "sm_clock_mhz": mean_of([s.sm_mhz for s in inside]),
        "utilization_pct": mean_of([s.utilization_pct for s in inside]),
        "power_w": mean_of([s.power_w for s in inside]),
        "throttle_reasons": shares,
    }


def reconstructed_spans(raw: Row) -> tuple[list[tuple[datetime, datetime]], dict[str, float]]:
    """Every window's (start, end) rebuilt from the schedule, in the order of raw["windows"],
    and per part the time the schedule leaves unaccounted (the part's recorded duration less
    the rebuilt end of its last window: scrapes, PUTs, the daemon's stop, the drain); a
    window's rebuilt times are early by up to its part's unaccounted time."""
    meta = raw["meta"]
    ready = datetime.fromisoformat(meta["date"]) + timedelta(seconds=meta["startup_s"])
    learn_s = (meta.get("nightjar") or {}).get("learn_s", 0.0)
    warmup_s = meta.get("warmup_s", DEFAULT_WARMUP_S)
    spans: dict[int, tuple[datetime, datetime]] = {}
    unaccounted: dict[str, float] = {}
    part_start = ready
    for part, duration in raw["durations_s"].items():
        at = part_start + timedelta(seconds=warmup_s)
        for position, w in enumerate(raw["windows"]):
            if w["part"] == f"{part}-arms":
                wait = meta["settle_s"] + (learn_s if w["arm"] == NIGHTJAR else 0.0)
                at += timedelta(seconds=wait)
            elif w["part"] != f"{part}-daemon":
                continue
            spans[position] = (at, at + timedelta(seconds=w["wall_s"]))
            at = spans[position][1]
        part_end = part_start + timedelta(seconds=duration)
        unaccounted[part] = round((part_end - at).total_seconds(), 1)
        part_start = part_end
    missing = [w["part"] for i, w in enumerate(raw["windows"]) if i not in spans]
    if missing:
        raise ValueError(f"windows of parts without a recorded duration: {sorted(set(missing))}")
    return [spans[i] for i in range(len(raw["windows"]))], unaccounted


def window_spans(raw: Row) -> tuple[list[tuple[datetime, datetime]], str, dict[str, float]]:
    """Every window's (start, end), in the order of raw["windows"]: recorded where every row
    has its times, else rebuilt from the schedule (``reconstructed_spans``); how they were
    aligned ("recorded" or "reconstructed (approximate)") and, when rebuilt, the time per part
    the schedule leaves unaccounted."""
    windows = raw["windows"]
    if all("started_utc" in w for w in windows):
        spans = [(datetime.fromisoformat(w["started_utc"]), datetime.fromisoformat(w["ended_utc"]))
                 for w in windows]  # fmt: skip
        return spans, "recorded", {}
    spans, unaccounted = reconstructed_spans(raw)
    return spans, "reconstructed (approximate)", unaccounted


def annotate(raw: Row, samples: list[Sample], gpus: set[int] | None) -> Row:
    """Each window of ``raw`` gets ``gpu`` in place: the span it was aligned by (``aligned``:
    "recorded" or "reconstructed (approximate)") and window_gpu's (``samples`` 0: none inside);
    returns how they were aligned."""
    spans, aligned, unaccounted = window_spans(raw)
    for w, (start, end) in zip(raw["windows"], spans, strict=True):
        w["gpu"] = {
            "aligned": aligned,
            "started_utc": start.isoformat(timespec="milliseconds"),
            "ended_utc": end.isoformat(timespec="milliseconds"),
            **(window_gpu(samples, start, end, gpus) or {"samples": 0}),
        }
    return {
        "gpus": sorted(gpus) if gpus is not None else "every GPU in the log",
        "aligned": aligned,
        **({"unaccounted_s_per_part": unaccounted} if unaccounted else {}),
    }
