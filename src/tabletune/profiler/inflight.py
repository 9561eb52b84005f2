"""In-flight timing: B requests kept decoding, k switched at run time, step times read from the
plugin's step cells (docs/profiler.md, "Method").

For each batch size of the grid, in increasing order: hold exactly B requests decoding (send
more to go up; fresh ones when contexts would grow past the cap), wait for a window of steps
that is B requests decoding and nothing else, then for each repeat and each k (the k order
rotated per repeat) set "k at every batch size" and read the increase of the cell of (B, k)
over the next window of ``window_steps`` steps. A window is one sample: its steps' mean
duration. The step that drafts the new k while verifying the old is counted apart by the
plugin (a switch step), so no window holds one; a window that is not exactly B requests
decoding at k (a request ended, prefill rode along) is taken again with fresh requests. A
cell costs tens of steps, not a prefill of B prompts per sample. Suspicious cells are
re-measured and flagged as with the request method.

Readings come through the admin API's step-cells route where the server has it: the engine's
totals as of its last finished step, so waits are planned from step times (a window is read
half a step before it should be full; the engine has stopped once no step came for a few step
times). Through /metrics (an older plugin) they are as of the plugin's last sync: /metrics is
polled and waits are counted in sync intervals. Through the route, a window's reads are
conditional table PUTs of the next window's k: the one that finds the window full sets that k
in the same engine call, between the same two steps (a plugin without them: read, then set k).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from tabletune.profiler.errors import MeasurementError
from tabletune.profiler.inflight_plan import (
    Group,
    Holding,
    k_orders,
    next_action,
    output_tokens,
    planning_step_s,
    wait_for_window,
)
from tabletune.profiler.measure import TimingResult, remeasure
from tabletune.profiler.progress import Reporter
from tabletune.profiler.prompts import TokenPrompts
from tabletune.profiler.records import WindowSample
from tabletune.profiler.settings import InFlightSettings, TimingSettings
from tabletune.profiler.step_reading import (
    StepReading,
    window_broken,
    window_problem,
    window_totals,
)
from tabletune.profiler.timing import CellDetails, CellKey
from tabletune.profiler.traffic import Traffic
from tabletune.schemas.shape import PrefillStream, TimingShape
from tabletune.step_cells import CellTotals

log = logging.getLogger("tabletune.profiler")

PHASES = ("stop", "settle", "k_switch", "fill")
"""where the in-flight measurer's wall time goes: stopping every request and waiting for the
engine to go idle (fresh starts), sending requests and waiting until they decode (fresh starts
and going up in B), setting k, and waiting for a window's steps (its own steps, the steps at the
old k before the switch lands, and the wait for the reading that shows them)"""
READING = "read"
"""wall time inside the step-cell reads (part of the phases above: is the server slow to
answer?)"""


class StepCellEngine(Protocol):
    """What the in-flight measurer needs of the engine (``EngineHttp`` has it)."""

    def set_k_everywhere(self, k: int, max_num_seqs: int) -> object: ...

    def step_reading(self) -> StepReading: ...

    def switch_k_when_full(
        self, k: int, max_num_seqs: int, *, cell: tuple[int, int], at_least: int
    ) -> tuple[StepReading, bool] | None:
        """Set k in the engine call that reads the step cells, if the cell (k, batch size)
        holds ``at_least`` steps then: that reading and whether k was set; None where the
        server has no such call (then: read, then ``set_k_everywhere``)."""

    @property
    def readings_fresh(self) -> bool:
        """Whether the last reading was the engine's own (as of its last finished step), not
        the plugin's last sync."""


class InFlightMeasurer:
    """Times cells on one engine; every window goes to ``on_window`` as it is taken."""

    def __init__(
        self,
        engine: StepCellEngine,
        traffic: Traffic,
        *,
        settings: TimingSettings,
        in_flight: InFlightSettings,
        max_num_seqs: int,
        reporter: Reporter,
        on_window: Callable[[WindowSample], None],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._engine = engine
        self._traffic = traffic
        self._settings = settings
        self._in = in_flight
        self._max = max_num_seqs
        self._reporter = reporter
        self._on_window = on_window
        self._clock = clock
        self._sleep = sleep
        self._prompts = TokenPrompts.for_timing(settings)
        self._stream = in_flight.prefill_stream is not None
        self._holding = Holding()
        self._k: int | None = None
        self._last = StepReading()
        self._read_last = StepReading()
        self._changed_at = clock()
        self._sync_gaps: deque[float] = deque([in_flight.sync_interval_s], maxlen=8)
        self._step_times: deque[float] = deque(maxlen=8)
        self._step_at_k: dict[int, float] = {}  # the latest window's mean step time at each k
        self._step_at: dict[CellKey, float] = {}  # ... and at each (B, k)
        self._idle_since_change = False
        self._switch_pending = False  # k changed since the reading the next window starts from
        self._windows: dict[CellKey, list[WindowSample]] = {}
        self.refused: list[str] = []
        self.phases_s = dict.fromkeys((*PHASES, READING), 0.0)
        self.events: Counter[str] = Counter()

    @property
    def fresh_starts(self) -> int:
        return self.events["fresh_starts"]

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        started = self._clock()
        try:
            yield
        finally:
            self.phases_s[name] += self._clock() - started

    # -- readings and k ----------------------------------------------------------------------
    def _read(self, fetch: Callable[[], StepReading] | None = None) -> StepReading:
        """The latest reading (``fetch``: taken otherwise than by a plain read); notes when it
        changed, which tells how often the plugin syncs (a reading through /metrics changes on
        every sync while the engine steps), and the mean step time of the steps since the
        reading before."""
        errors = self._traffic.failures()
        if errors:
            raise MeasurementError(f"a timed request failed: {errors[0]}")
        started = self._clock()
        reading = (fetch or self._engine.step_reading)()
        self.phases_s[READING] += self._clock() - started
        self.events["reads"] += 1
        self.events["route_reads"] += self._fresh  # the rest came from /metrics
        if reading != self._read_last:
            now = self._clock()
            if not self._idle_since_change:  # a gap across an idle engine is no sync interval
                self._sync_gaps.append(now - self._changed_at)
            if self.events["reads"] > 1:  # the first one holds every step since the start
                self._note_step_time(reading, self._read_last)
            self._changed_at, self._read_last = now, reading
            self._idle_since_change = False
        return reading

    def _note_step_time(self, reading: StepReading, earlier: StepReading) -> None:
        """From the totals' difference, not cell by cell: this runs between a window's last
        read and the next k switch, and the window's own ``since`` checks the counters."""
        timed = reading.decoding.since(earlier.decoding)
        if timed.steps > 0:
            self._step_times.append(timed.mean_s)

    @property
    def _fresh(self) -> bool:
        """Whether readings come through the route (as of the engine's last finished step)."""
        return self._engine.readings_fresh

    @property
    def _step_s(self) -> float:
        """The latest mean step time seen (0: none yet)."""
        return self._step_times[-1] if self._step_times else 0.0

    def _poll_s(self) -> float:
        """The wait between two readings while waiting for steps: a step (a fresh reading is
        answered after the step running anyway), or the /metrics polling interval."""
        if self._fresh:
            return max(self._in.poll_s, self._step_s)
        return self._in.metrics_poll_s

    def _quiet_s(self) -> float:
        """How long no step may be counted before the engine counts as stopped: a few of the
        longest recent steps (fresh readings), or 2.5 sync intervals (/metrics)."""
        if self._fresh:
            return max(self._in.poll_s, self._in.idle_steps * max(self._step_times, default=0.0))
        return 2.5 * self.sync_interval_s

    @property
    def sync_interval_s(self) -> float:
        """How often the readings changed lately while the engine stepped: the plugin's sync
        interval as seen from here (plus the polling's granularity)."""
        return max(self._sync_gaps)

    def _wait_idle(self) -> None:
        """Wait until the engine stopped stepping: no change for ``_quiet_s`` (through /metrics:
        2.5 sync intervals, the longest gap between changes seen lately). Requests just stopped
        may run on until the engine sees their client gone; alone they could look like the
        batch wanted."""
        deadline = self._clock() + self._in.window_timeout_s
        while self._clock() < deadline:
            self._read()
            quiet = self._quiet_s()
            if self._clock() - self._changed_at >= quiet:
                self._idle_since_change = True
                return
            self._sleep(max(self._in.poll_s, quiet / 3) if self._fresh else self._in.metrics_poll_s)
        raise MeasurementError(
            f"the engine kept stepping {self._in.window_timeout_s:.0f}s after every request was "
            "stopped: is other traffic running?"
        )

    def _set_k(self, k: int) -> bool:
        """Set k at every batch size; whether it changed (steps at the old k, and a switch
        step, come before the first step at the new one)."""
        if k == self._k:
            return False
        with self._phase("k_switch"):
            self._engine.set_k_everywhere(k, self._max)
        self._switched_to(k)
        return True

    def _switched_to(self, k: int) -> None:
        self._k = k
        self._switch_pending = True
        self.events["k_switches"] += 1

    def _k_for_window(self, k: int) -> bool:
        """Set k for a window; whether k changed since the reading the window starts from (then
        the old k's steps and a switch step come before its first)."""
        self._set_k(k)
        switched, self._switch_pending = self._switch_pending, False
        return switched

    def _read_or_switch(
        self, batch: int, k: int, at_least: int, then_k: int
    ) -> tuple[StepReading, bool]:
        """A reading of a window at (``batch``, ``k``) in the engine call that sets ``then_k``
        once the window's cell holds ``at_least`` steps: a window that is full is closed and the
        next one's k set between the same two steps (no round trip between them, one old-k
        step fewer). A server without that call gets a read (and k is set after it, as
        before). The reading, and whether it set ``then_k``."""
        switched = False

        def fetch() -> StepReading:
            nonlocal switched
            answer = self._engine.switch_k_when_full(
                then_k, self._max, cell=(k, batch), at_least=at_least
            )
            if answer is None:
                return self._engine.step_reading()
            reading, switched = answer
            return reading

        reading = self._read(fetch)
        if switched:
            self._switched_to(then_k)
            self.events["read_switches"] += 1
        return reading, switched

    # -- holding B requests ------------------------------------------------------------------
    def _send(self, count: int) -> StepReading:
        """Send ``count`` requests; the reading taken just before (settling starts from it)."""
        prompt = self._settings.prompt_tokens
        sent_from = self._read()
        self._traffic.send(
            self._prompts.take(count),
            max_tokens=output_tokens(prompt, self._in.max_context),
        )
        self._holding = self._holding.with_group(Group(count, prompt, sent_from.engine_steps))
        return sent_from

    def _hold(self, batch: int, k: int) -> None:
        """Exactly ``batch`` requests decoding at ``k``, and a reading taken while they were.
        k is set before requests are sent: the settling steps run at it, so the window that
        follows starts from the settled reading with no switch in between."""
        action = next_action(
            self._holding,
            batch,
            self._last.engine_steps,
            coming_steps=2 * self._in.window_steps,
            max_context=self._in.max_context,
        )
        if action == "keep":
            return
        if action == "fresh":
            with self._phase("stop"):
                self._stop()
        self._set_k(k)
        self.events["fresh_starts" if action == "fresh" else "adds"] += 1
        with self._phase("settle"):
            sent_from = self._send(batch - self._holding.running)
            if self._in.prefill_stream is not None:
                self._traffic.start_stream(self._in.prefill_stream)
            self._settle(batch, sent_from)

    def _stop(self) -> None:
        """Stop every request (and the prefill stream) and wait for the engine to go idle."""
        self._traffic.stop_stream()
        self._traffic.stop_all()
        self._holding = Holding()
        self._wait_idle()

    def _settle(self, batch: int, previous: StepReading) -> None:
        """Wait for a window (between two readings that differ, the first one ``previous``) of
        steps that are ``batch`` requests decoding at the current k: every request sent is in
        and past its prefill. (Going up, the ones kept are fewer than ``batch``; starting over,
        the stopped ones are gone.)"""
        assert self._k is not None
        deadline = self._clock() + self._in.window_timeout_s
        problem = "no step yet"
        while self._clock() < deadline:
            self._sleep(self._poll_s())
            reading = self._read()
            if reading == previous:
                continue  # no step (or no sync) since
            found = window_problem(reading.since(previous), batch, self._k, stream=self._stream)
            previous = reading
            if found is None:
                self._last = reading
                self._switch_pending = False  # these steps ran at the current k
                return
            problem = found
        raise MeasurementError(
            f"B={batch}: the requests sent did not settle into {batch} decoding within "
            f"{self._in.window_timeout_s:.0f}s (last window: {problem})"
        )

    # -- one window --------------------------------------------------------------------------
    def _full(self, totals: CellTotals) -> bool:
        if totals.steps >= self._in.window_steps:
            return True
        return totals.steps >= self._in.min_window_steps and totals.seconds >= self._in.window_max_s

    def _fill(
        self, batch: int, k: int, before: StepReading, *, switched: bool, then_k: int | None
    ) -> tuple[StepReading, StepReading]:
        """The reading that closes a window, and the window (its increase over ``before``);
        with fresh readings, ``then_k`` (the next window's k) is set by the read that finds
        the window full, in the same engine call."""
        with self._phase("fill"):
            return self._fill_window(batch, k, before, switched=switched, then_k=then_k)

    def _fill_window(
        self, batch: int, k: int, before: StepReading, *, switched: bool, then_k: int | None
    ) -> tuple[StepReading, StepReading]:
        deadline = self._clock() + self._in.window_timeout_s
        totals = CellTotals()
        at_least = round(before.cell(k, batch).steps) + self._in.window_steps
        while self._clock() < deadline:
            self._sleep(self._next_read_in(batch, k, totals, switched=switched))
            next_k_set = False
            if self._fresh and then_k is not None and then_k != k:
                reading, next_k_set = self._read_or_switch(batch, k, at_least, then_k)
            else:
                reading = self._read()
            window = reading.since(before)
            totals = window_totals(window, batch, k, stream=self._stream)
            if self._full(totals) or next_k_set:  # set: its cell holds window_steps more
                self._step_at_k[k] = self._step_at[(batch, k)] = totals.mean_s
                return reading, window
            if window_broken(window, batch, k, stream=self._stream):
                return reading, window  # no use waiting: the caller sees the problem
        raise MeasurementError(
            f"B={batch} k={k}: fewer than {self._in.min_window_steps} steps within "
            f"{self._in.window_timeout_s:.0f}s: is the engine running the requests?"
        )

    def _next_read_in(self, batch: int, k: int, totals: CellTotals, *, switched: bool) -> float:
        """Fresh readings: planned from step times to land in the window's last step (before
        its first step, from the cell's previous window, else the fastest guess at hand: steps
        at another k or batch size may be far off); through /metrics: the polling interval (the
        window ends on the first sync that fills it)."""
        if self._fresh:
            step_s = planning_step_s(
                cell_s=self._step_at.get((batch, k)),
                k_s=self._step_at_k.get(k),
                latest_s=self._step_s,
            )
            return wait_for_window(totals, step_s=step_s, settings=self._in, switched=switched)
        return self._in.metrics_poll_s

    def window(self, batch: int, k: int, round_: int, *, then_k: int | None = None) -> float:
        """One sample of (B, k): a window of steps that is exactly B decoding at k; ``then_k``:
        the next window's k, set as this one closes where the server can."""
        problem = ""
        for _ in range(self._in.attempts):
            started = self._clock()
            self._hold(batch, k)
            before = self._last
            switched = self._k_for_window(k)
            reads = self.events["reads"]
            after, window = self._fill(batch, k, before, switched=switched, then_k=then_k)
            self._last = after
            found = window_problem(window, batch, k, stream=self._stream)
            if found is None:
                reads = self.events["reads"] - reads
                return self._record(batch, k, round_, (before, after, window), reads, started)
            problem = found
            self.refused.append(problem)
            log.info("window taken again: %s", problem)
            self._holding = Holding()  # something ended or joined: start over with fresh ones
        raise MeasurementError(
            f"B={batch} k={k}: {self._in.attempts} windows in a row were not {batch} requests "
            f"decoding at k={k} (last: {problem})"
        )

    def _record(
        self,
        batch: int,
        k: int,
        round_: int,
        readings: tuple[StepReading, StepReading, StepReading],
        reads: int,
        started: float,
    ) -> float:
        """``readings``: before, after, and the window between them; ``reads``: the readings
        taken to fill it; ``started``: when its requests were started or its k set."""
        before, after, window = readings
        totals = window_totals(window, batch, k, stream=self._stream)
        middle = (before.engine_steps + after.engine_steps) / 2
        sample = WindowSample(
            batch_size=batch,
            k=k,
            round=round_,
            steps=totals.steps,
            seconds=totals.seconds,
            seconds_sq=totals.seconds_sq,
            tokens=totals.tokens,
            requests=totals.requests,
            context_tokens=self._holding.mean_context(middle),
            step_ms=1000.0 * totals.mean_s,
            engine_steps=window.engine_steps,
            reads=reads,
            wall_s=self._clock() - started,
        )
        self._windows.setdefault((batch, k), []).append(sample)
        self.events["windows"] += 1
        self._on_window(sample)
        return sample.step_ms

    # -- the grid ----------------------------------------------------------------------------
    def _warm_up(self, ks: Sequence[int]) -> None:
        """One unrecorded window per k at a few batch sizes: lazy set-up happens here."""
        for batch in sorted({min(b, self._max) for b in self._settings.warmup_batches}):
            for k in ks:
                self._hold(batch, k)
                before = self._last
                switched = self._k_for_window(k)
                self._last, _ = self._fill(batch, k, before, switched=switched, then_k=None)

    def _cells(self, cells: Sequence[CellKey], round_: int) -> dict[CellKey, list[float]]:
        """``repeats`` windows of each cell, batch sizes in increasing order, k interleaved."""
        out: dict[CellKey, list[float]] = {}
        plan = [
            (batch, k)
            for batch in sorted({b for b, _ in cells})
            for order in k_orders(sorted(k for b, k in cells if b == batch), self._settings.repeats)
            for k in order
        ]
        for (batch, k), coming in itertools.zip_longest(plan, plan[1:]):
            then_k = None if coming is None else coming[1]
            out.setdefault((batch, k), []).append(self.window(batch, k, round_, then_k=then_k))
            self._reporter.advance(f"B={batch} k={k}")
        return out

    def measure(self, grid: Sequence[int], ks: Sequence[int]) -> TimingResult:
        result = TimingResult()
        self._set_k(ks[0])
        try:
            self._warm_up(ks)
            self._reporter.phase("timing (in-flight)", len(grid) * len(ks) * self._settings.repeats)
            result.samples = self._cells([(b, k) for b in grid for k in ks], 0)
            self._reporter.done()
            remeasure(
                result,
                grid,
                settings=self._settings,
                reporter=self._reporter,
                measure_again=self._cells,
            )
        finally:
            self._traffic.stop_stream()
            self._traffic.stop_all()
        with self._phase("stop"):
            self._wait_idle()  # nothing of this phase runs into the next
        result.details = {cell: details_of(windows) for cell, windows in self._windows.items()}
        result.refused = list(self.refused)
        result.events = dict(self.events)
        return result


def details_of(windows: Sequence[WindowSample]) -> CellDetails:
    """Mean context and tokens per step over a cell's windows (every round)."""
    steps = sum(w.steps for w in windows)
    return CellDetails(
        context_tokens=sum(w.context_tokens * w.steps for w in windows) / steps,
        tokens_per_step=sum(w.tokens for w in windows) / steps,
    )


def shape_of_windows(
    windows: Sequence[WindowSample], *, prompt_tokens: int, stream: PrefillStream | None
) -> TimingShape:
    """The traffic shape the windows were timed under (means over their steps)."""
    steps = sum(w.steps for w in windows)
    extra = sum(w.tokens - w.requests * (1 + w.k) for w in windows)
    return TimingShape(
        prompt_tokens=prompt_tokens,
        context_tokens=sum(w.context_tokens * w.steps for w in windows) / steps if steps else None,
        extra_tokens_per_step=max(0.0, extra / steps) if steps else 0.0,
        prefill_stream=stream,
    )
