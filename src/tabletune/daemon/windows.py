"""Exact counter increases over a window from raw Prometheus samples, pure.

Prometheus keeps, per target, what each scrape read, at the scrape's timestamp, and writes
``up`` (1 read, 0 failed) at every scrape. A window ``(since, at]`` of one target counts from
its *base* scrape (the last successful one at or before ``since``) to its *end* scrape (the
last successful one at or before ``at``): per series, the value at the end minus the value at
the base, adding across restarts (after a restart the value counts from zero). Adjacent
windows share a scrape, so they add up exactly; nothing is extrapolated (``increase()`` is not
used).

A window is refused, never counted from zero, when Prometheus cannot vouch for it: no scrape
within the allowance before ``since`` (Prometheus was down, restarted empty, or the target is
new), no recent scrape at its end (Prometheus down or behind), or no successful scrape in it
(the target is down). Restarts are seen in the start series (process start time,
``_created``: a new value is a new process) or as a counter that went back.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Sample = tuple[float, float]  # (timestamp in seconds, value)

ALLOWANCE_SCRAPES = 1.5  # a base or end scrape may be this many scrape intervals away
SAME_SCRAPE_S = 1e-3  # samples of one scrape share its timestamp (millisecond resolution)


@dataclass(frozen=True)
class TargetWindow:
    """A window of one target that can be counted exactly."""

    base: float | None  # the scrape counted from; None: the process started inside the window
    end: float  # the last successful scrape of the window
    restarts: tuple[float, ...]  # first scrape of each new process after the base
    clean: bool  # base and end are the last scrapes before and in the window; no restart seen
    starts_vouch: bool = False  # a start series was read at base and end: no restart hides

    @property
    def reset(self) -> bool:
        return self.base is None or bool(self.restarts)


@dataclass(frozen=True)
class Refused:
    """A window that cannot be counted exactly; ``reason`` says why (one line)."""

    reason: str


def scrape_interval(up: Sequence[Sample]) -> float | None:
    """The target's scrape interval: the median spacing of its ``up`` samples."""
    if len(up) < 2:
        return None
    return statistics.median(b[0] - a[0] for a, b in itertools.pairwise(up))


def restart_marks(starts: Iterable[Sequence[Sample]]) -> list[float]:
    """Timestamps of the first scrape of each new process: where a start series changed."""
    marks = {b[0] for series in starts for a, b in itertools.pairwise(series) if b[1] != a[1]}
    return sorted(marks)


def _started_after(starts: Sequence[Sequence[Sample]], scrape: float, since: float) -> bool:
    """Some start series read at ``scrape`` says the process started after ``since``."""
    return any(
        abs(ts - scrape) <= SAME_SCRAPE_S and value > since
        for series in starts
        for ts, value in series
    )


def judge(
    up: Sequence[Sample],
    starts: Sequence[Sequence[Sample]],
    *,
    since: float,
    at: float,
) -> TargetWindow | Refused:
    """Can the window ``(since, at]`` of one target be counted, and from which scrape?

    ``up`` and ``starts`` are the target's raw samples (sorted by time) from well before
    ``since`` to ``at``; the allowance is ``ALLOWANCE_SCRAPES`` scrape intervals."""
    interval = scrape_interval(up)
    if interval is None or interval <= 0:
        return Refused("fewer than two scrapes in Prometheus: a new target, or no older data")
    allowance = ALLOWANCE_SCRAPES * interval
    before = [s for s in up if s[0] <= since]
    if not before or since - before[-1][0] > allowance:
        return Refused(
            f"no scrape in the {allowance:.3g} s before the window start (Prometheus was down or "
            "restarted empty, or the target is new); counting starts with the next window"
        )
    last = [s for s in up if s[0] <= at][-1]
    if at - last[0] > allowance:
        return Refused(f"no scrape in the last {at - last[0]:.3g} s (Prometheus down or behind)")
    answered = [s[0] for s in up if since < s[0] <= at and s[1] == 1]
    if not answered:
        return Refused("the target answered no scrape in the window (up=0): it is down")
    end = answered[-1]  # a failed scrape after it reads nothing: the next window starts here
    succeeded = [s[0] for s in before if s[1] == 1]
    marks = restart_marks(starts)
    if succeeded:
        base: float | None = succeeded[-1]
        after = succeeded[-1]
    else:
        if not _started_after(starts, answered[0], since):
            return Refused(
                f"the target was down for the {since - up[0][0]:.3g} s before the window and "
                "no start time shows a restart since: its counts at the window start are unknown"
            )
        base, after = None, answered[0]
    restarts = tuple(m for m in marks if after < m <= end)
    clean = base == before[-1][0] and end == last[0] and not restarts
    vouch = base is not None and any(
        _read_at(series, base) and _read_at(series, end) for series in starts
    )
    return TargetWindow(base=base, end=end, restarts=restarts, clean=clean, starts_vouch=vouch)


def _read_at(series: Sequence[Sample], scrape: float) -> bool:
    return any(abs(ts - scrape) <= SAME_SCRAPE_S for ts, _ in series)


def series_increase(samples: Sequence[Sample], window: TargetWindow) -> tuple[float, bool]:
    """(increase over the window, whether the counter went back) of one counter series of the
    window's target, from its raw samples sorted by time.

    The value at the base is the sample of the base scrape, or 0 when that scrape did not
    have the series (it is new since). A drop, or a restart between two samples, means the
    later value counts from zero."""
    if window.base is None:
        prev_ts, prev_value = -math.inf, 0.0
    else:
        prev_ts = window.base
        prev_value = next((v for ts, v in samples if abs(ts - window.base) <= SAME_SCRAPE_S), 0.0)
    total = 0.0
    went_back = False
    for ts, value in samples:
        if ts <= prev_ts + SAME_SCRAPE_S or ts > window.end + SAME_SCRAPE_S:
            continue
        dropped = value < prev_value
        if dropped or any(prev_ts < m <= ts + SAME_SCRAPE_S for m in window.restarts):
            total += value
        else:
            total += value - prev_value
        went_back = went_back or dropped
        prev_ts, prev_value = ts, value
    return total, went_back
