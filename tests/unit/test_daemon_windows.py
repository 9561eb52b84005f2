"""Exact windows from raw samples: a simulated target (scraped every second, with restarts,
downtime and Prometheus gaps) against the window arithmetic, and named cases."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune.daemon.windows import (
    Refused,
    Sample,
    TargetWindow,
    judge,
    scrape_interval,
    series_increase,
)

T0 = 100.0  # scrape i happens at T0 + i (one-second scrape interval)
LOOKBACK = 6.0  # how far before the window start the query reaches


@dataclass(frozen=True)
class World:
    """One target's history: per scrape, whether Prometheus recorded it, whether the engine
    answered, whether a new process answers it, and the events counted since the scrape
    before (only while the engine serves)."""

    recorded: tuple[bool, ...]
    answered: tuple[bool, ...]
    new_process: tuple[bool, ...]
    events: tuple[int, ...]
    starts_exported: bool

    def t(self, i: int) -> float:
        return T0 + i

    def counter(self) -> list[float]:
        """The counter each scrape would read."""
        out, value = [], 0.0
        for i, events in enumerate(self.events):
            if self.new_process[i]:
                value = 0.0
            value += events if self.answered[i] else 0
            out.append(value)
        return out

    def process_start(self) -> list[float]:
        out, start = [], 0.0
        for i in range(len(self.events)):
            if self.new_process[i]:
                start = self.t(i) - 0.5
            out.append(start)
        return out

    def samples(
        self, since: float, at: float
    ) -> tuple[list[Sample], list[list[Sample]], list[Sample]]:
        """(up, start series, counter) as a range query from ``since - LOOKBACK`` to ``at``."""
        shown = [
            i
            for i in range(len(self.events))
            if self.recorded[i] and since - LOOKBACK <= self.t(i) <= at
        ]
        read = [i for i in shown if self.answered[i]]
        up = [(self.t(i), 1.0 if self.answered[i] else 0.0) for i in shown]
        counter, start = self.counter(), self.process_start()
        starts = [[(self.t(i), start[i]) for i in read]] if self.starts_exported else []
        return up, starts, [(self.t(i), counter[i]) for i in read]

    def events_between(self, after: float, until: float) -> int:
        """Events the engine counted at scrapes in (after, until]."""
        return sum(
            e for i, e in enumerate(self.events) if after < self.t(i) <= until and self.answered[i]
        )

    def restarted_between(self, after: float, until: float) -> bool:
        return any(
            self.new_process[i] for i in range(len(self.events)) if after < self.t(i) <= until
        )


@st.composite
def worlds(draw: st.DrawFn, *, starts_exported: bool | None = None) -> World:
    n = draw(st.integers(min_value=12, max_value=40))
    recorded = draw(st.lists(st.sampled_from([True] * 6 + [False]), min_size=n, max_size=n))
    answered = draw(st.lists(st.sampled_from([True] * 5 + [False]), min_size=n, max_size=n))
    restart = draw(st.lists(st.sampled_from([False] * 8 + [True]), min_size=n, max_size=n))
    events = draw(st.lists(st.integers(min_value=0, max_value=50), min_size=n, max_size=n))
    # a new process answers first where it is counted: a restart lands on an answered scrape
    new_process = [r and a for r, a in zip(restart, answered, strict=True)]
    new_process[0] = False
    # What a process counts after its last recorded scrape dies with it: no observer can
    # count it, so the simulated engine counts nothing there.
    read = [i for i in range(n) if recorded[i] and answered[i]]
    for i in range(n):
        following = [j for j in read if j >= i]
        if following and any(new_process[i + 1 : following[0] + 1]):
            events[i] = 0
    exported = draw(st.booleans()) if starts_exported is None else starts_exported
    return World(tuple(recorded), tuple(answered), tuple(new_process), tuple(events), exported)


@st.composite
def windows_in(draw: st.DrawFn, world: World) -> tuple[float, float]:
    n = len(world.events)
    a = draw(st.integers(min_value=0, max_value=n - 3))
    b = draw(st.integers(min_value=a + 1, max_value=n - 1))
    offsets = st.floats(min_value=0.0, max_value=0.9)
    return world.t(a) + draw(offsets), world.t(b) + draw(offsets)


def count(world: World, since: float, at: float) -> tuple[TargetWindow | Refused, float, bool]:
    up, starts, counter = world.samples(since, at)
    verdict = judge(up, starts, since=since, at=at)
    if isinstance(verdict, Refused):
        return verdict, 0.0, False
    total, went_back = series_increase(counter, verdict)
    return verdict, total, went_back


def truth(world: World, verdict: TargetWindow, since: float) -> tuple[int, bool]:
    after = since if verdict.base is None else verdict.base
    return world.events_between(after, verdict.end), world.restarted_between(after, verdict.end)


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_with_start_times_every_counted_window_is_exact(data: st.DataObject) -> None:
    world = data.draw(worlds(starts_exported=True))
    since, at = data.draw(windows_in(world))
    verdict, total, went_back = count(world, since, at)
    if isinstance(verdict, Refused):
        return
    events, restarted = truth(world, verdict, since)
    assert total == events
    assert (verdict.reset or went_back) == (restarted or verdict.base is None)


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_without_start_times_a_restart_is_seen_when_a_counter_went_back(
    data: st.DataObject,
) -> None:
    world = data.draw(worlds(starts_exported=False))
    since, at = data.draw(windows_in(world))
    verdict, total, went_back = count(world, since, at)
    if isinstance(verdict, Refused):
        return
    assert verdict.base is not None  # without a start time, nothing else vouches for zero
    events, restarted = truth(world, verdict, since)
    assert total <= events  # a restart hidden by a counter that climbed back loses counts
    _, _, counter = world.samples(since, at)
    values = [v for ts, v in counter if verdict.base <= ts <= verdict.end]
    if all(b >= a for a, b in itertools.pairwise(values)) and not restarted:
        assert total == events and not went_back
    if went_back:
        assert restarted


@given(st.data())
@settings(max_examples=150, deadline=None)
def test_adjacent_windows_add_up(data: st.DataObject) -> None:
    world = data.draw(worlds(starts_exported=True))
    since, at = data.draw(windows_in(world))
    middle = data.draw(st.floats(min_value=since + 0.01, max_value=at - 0.01))
    whole, total, _ = count(world, since, at)
    first, part1, _ = count(world, since, middle)
    second, part2, _ = count(world, middle, at)
    if any(isinstance(v, Refused) for v in (whole, first, second)):
        return
    assert part1 + part2 == total


@given(st.data())
@settings(max_examples=150, deadline=None)
def test_a_window_is_refused_only_when_prometheus_cannot_vouch_for_it(
    data: st.DataObject,
) -> None:
    world = data.draw(worlds())
    since, at = data.draw(windows_in(world))
    up, _, _ = world.samples(since, at)
    verdict, _, _ = count(world, since, at)
    interval = scrape_interval(up)
    if interval is None:
        assert isinstance(verdict, Refused)
        return
    allowance = 1.5 * interval
    before = [s for s in up if s[0] <= since]
    last = [s for s in up if s[0] <= at][-1] if before else None
    vouched = (
        bool(before)
        and since - before[-1][0] <= allowance
        and last is not None
        and at - last[0] <= allowance
        and any(v == 1.0 for ts, v in up if since < ts <= at)
        and any(v == 1.0 for _, v in before)
    )
    if vouched:
        assert isinstance(verdict, TargetWindow)
    if not vouched and isinstance(verdict, TargetWindow):
        assert verdict.base is None  # down before the window, restarted inside it


def always(n: int) -> tuple[bool, ...]:
    return (True,) * n


def steady(n: int = 20, **changes: tuple[object, ...]) -> World:
    base = {
        "recorded": always(n),
        "answered": always(n),
        "new_process": (False,) * n,
        "events": (10,) * n,
        "starts_exported": True,
    }
    return World(**{**base, **changes})  # type: ignore[arg-type]


def test_a_new_target_or_an_empty_prometheus_is_refused_not_counted_from_zero() -> None:
    world = steady(recorded=(False,) * 10 + (True,) * 10)  # Prometheus has data from scrape 10
    verdict, _, _ = count(world, world.t(9) + 0.5, world.t(15) + 0.5)
    assert isinstance(verdict, Refused) and "before the window start" in verdict.reason
    verdict, total, _ = count(world, world.t(15) + 0.5, world.t(18) + 0.5)
    assert total == 30  # the next window starts fresh, from scrape 15


def test_a_prometheus_gap_across_the_window_start_is_refused() -> None:
    recorded = tuple(not 6 <= i <= 9 for i in range(20))
    verdict, _, _ = count(steady(recorded=recorded), T0 + 9.5, T0 + 15.5)
    assert isinstance(verdict, Refused)


def test_a_prometheus_gap_inside_the_window_still_counts_exactly() -> None:
    recorded = tuple(not 10 <= i <= 13 for i in range(20))
    verdict, total, _ = count(steady(recorded=recorded), T0 + 8.5, T0 + 16.5)
    assert isinstance(verdict, TargetWindow) and total == 80


def test_a_failed_last_scrape_ends_the_window_at_the_one_before() -> None:
    answered = tuple(i != 15 for i in range(20))
    verdict, total, _ = count(steady(answered=answered), T0 + 10.5, T0 + 15.5)
    assert isinstance(verdict, TargetWindow) and verdict.end == T0 + 14 and total == 40
    verdict, total, _ = count(steady(answered=answered), T0 + 15.5, T0 + 17.5)
    assert isinstance(verdict, TargetWindow) and verdict.base == T0 + 14 and total == 20


def test_a_target_down_for_the_whole_window_or_prometheus_behind_is_refused() -> None:
    answered = tuple(not 11 <= i <= 16 for i in range(20))
    verdict, _, _ = count(steady(answered=answered), T0 + 11.5, T0 + 15.5)
    assert isinstance(verdict, Refused) and "down" in verdict.reason
    recorded = tuple(i < 13 for i in range(20))
    verdict, _, _ = count(steady(recorded=recorded), T0 + 10.5, T0 + 15.5)
    assert isinstance(verdict, Refused) and "last" in verdict.reason


def test_an_engine_down_across_the_window_start_restarting_inside_it() -> None:
    answered = tuple(not 4 <= i <= 13 for i in range(20))
    new_process = tuple(i == 14 for i in range(20))
    world = steady(answered=answered, new_process=new_process)
    verdict, total, _ = count(world, T0 + 12.5, T0 + 16.5)
    # the last successful scrape before the window (3) is beyond the lookback: the start
    # time (after the window start) vouches that everything counted since is in the window
    assert isinstance(verdict, TargetWindow) and verdict.base is None and verdict.reset
    assert total == 30
    no_start = steady(answered=answered, new_process=new_process, starts_exported=False)
    verdict, _, _ = count(no_start, T0 + 12.5, T0 + 16.5)
    assert isinstance(verdict, Refused) and "unknown" in verdict.reason


def test_a_restart_that_climbed_past_the_old_value_is_seen_by_its_start_time() -> None:
    events = tuple(1 if i < 12 else 500 for i in range(20))
    world = steady(events=events, new_process=tuple(i == 12 for i in range(20)))
    verdict, total, went_back = count(world, T0 + 10.5, T0 + 14.5)
    assert isinstance(verdict, TargetWindow) and verdict.reset and not went_back
    assert total == 1 + 3 * 500
