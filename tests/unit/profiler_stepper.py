"""A step-level fake of vLLM + the plugin in virtual time, for the in-flight measurer's tests.

It is both the measurer's engine (``set_k_everywhere``, ``step_reading``) and its traffic
(``send``, ``stop_all``, a prefill stream). Steps run back to back while the test "sleeps": each
step schedules every running request (a new one prefills its prompt, the others verify the
drafts proposed at the previous step's end, which is when the table is read, as with async
scheduling: with no steps queued, as that step ended, before the calls answered after it), lasts
``step_ms(B, k)`` plus a prefill cost, and is handed to the plugin's real ``StepTimer``; its
totals are published every ``sync_s`` (the HTTP side's sync), which is all ``step_reading`` sees
through /metrics (an older plugin), or, with ``fresh``, read as of the last finished step (the
admin API's step-cells route asks the engine). Every guess is rejected: one token per request
per step.

With ``between_steps`` every call (a read, a k switch, a conditional switch) is answered as
vLLM's engine core runs utility calls: between two steps, so one that arrives while a step runs
waits for its end; and ``queued_steps`` steps are already scheduled when a new k lands (async
scheduling), their drafts proposed at the old k. Then a read and a switch sent after it land
at two different step ends, and the one-call conditional switch at one.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tabletune.plugin.step_metrics import EngineSteps, step_cell_families
from tabletune.plugin.step_timer import StepTimer
from tabletune.profiler.prompts import Prompt
from tabletune.profiler.step_reading import StepReading
from tabletune.schemas.shape import PrefillStream

StepMs = Callable[[int, int], float]  # (B, verified k) -> ms
T = TypeVar("T")


def linear_ms(b: int, k: int) -> float:
    return 4.0 + 0.02 * b + 0.5 * k


@dataclass
class Request:
    ident: str
    prompt: int
    max_tokens: int
    produced: int = 0
    drafts: int = -1  # -1: not prefilled yet


@dataclass
class SteppingEngine:
    step_ms: StepMs = linear_ms
    sync_s: float = 0.05
    prefill_ms_per_token: float = 0.01
    jitter: float = 0.0
    """each step's duration times (1 + uniform(-jitter, jitter)), seeded"""
    now: float = 0.0
    k: int = 0
    puts: list[int] = field(default_factory=list)
    sent: list[tuple[int, int, int]] = field(default_factory=list)
    """(requests, prompt length, max_tokens) of every send"""
    aborts: int = 0
    scheduled: list[tuple[int, int, int]] = field(default_factory=list)
    """(B, verified k, tokens) of every step"""
    on_step: Callable[[SteppingEngine], None] | None = None
    """called after every step (tests break things here)"""
    fail_with: str | None = None
    fresh: bool = False
    """step_reading as of the last finished step (the step-cells route), not the last sync"""
    reads: int = 0
    k_at: Callable[[int], int] | None = None
    """the table's k at a batch size, when the table lives elsewhere (a fake admin API);
    default: the k of the last set_k_everywhere"""
    between_steps: bool = False
    """calls are answered between two steps (a call during a step waits for its end)"""
    queued_steps: int = 0
    """steps already scheduled when a new k lands: they verify drafts of the old k"""
    conditional: bool = True
    """the plugin takes a conditional k switch (False: an older one, switch_k_when_full None)"""
    read_switches: int = 0
    """conditional switches that set k"""

    def __post_init__(self) -> None:
        self.timer = StepTimer(started_at=0.0)
        self.running: list[Request] = []
        self.arriving: list[Request] = []
        self.published = StepReading()
        self._next_sync = self.sync_s
        self._step_end: float | None = None
        self._in_step: list[Request] = []
        self._ids = itertools.count()
        self._random = random.Random(7)
        self._stream: PrefillStream | None = None
        self._next_arrival = float("inf")
        self._at_step_end: list[Callable[[], None]] = []
        self._table_ks: deque[int] = deque(maxlen=self.queued_steps + 1)

    # -- what the measurer calls ---------------------------------------------------------------
    def clock(self) -> float:
        return self.now

    def set_k_everywhere(self, k: int, max_num_seqs: int) -> None:
        def put() -> None:
            self.k = k
            self.puts.append(k)

        self._between_steps(put)

    def switch_k_when_full(
        self, k: int, max_num_seqs: int, *, cell: tuple[int, int], at_least: int
    ) -> tuple[StepReading, bool] | None:
        if not (self.conditional and self.fresh):
            return None

        def put_when() -> tuple[StepReading, bool]:
            self.reads += 1
            reading = self.live_reading()
            full = reading.cell(*cell).steps >= at_least
            if full:
                self.k = k
                self.puts.append(k)
                self.read_switches += 1
            return reading, full

        return self._between_steps(put_when)

    @property
    def readings_fresh(self) -> bool:
        return self.fresh

    def step_reading(self) -> StepReading:
        def read() -> StepReading:
            self.reads += 1
            return self.live_reading() if self.fresh else self.published

        return self._between_steps(read)

    def _between_steps(self, call: Callable[[], T]) -> T:
        """``call`` now, or with ``between_steps`` at the end of the step running (if any)."""
        if not self.between_steps or self._step_end is None:
            return call()
        answers: list[T] = []
        self._at_step_end.append(lambda: answers.append(call()))
        self.sleep(self._step_end - self.now)
        return answers[0]

    def live_reading(self) -> StepReading:
        counter = self.timer.counter
        return StepReading(counter.totals(), counter.steps_without_decode, counter.switch_steps)

    def send(self, prompts: Sequence[Prompt], *, max_tokens: int) -> None:
        lengths = {len(p) for p in prompts}
        self.sent.append((len(prompts), max(lengths), max_tokens))
        for prompt in prompts:
            self.arriving.append(Request(f"r{next(self._ids)}", len(prompt), max_tokens))
        self._start_step_if_idle()

    def stop_all(self) -> None:
        self.aborts += 1
        self.running = [r for r in self.running if r.max_tokens == 1]  # the stream's survive
        self.arriving = [r for r in self.arriving if r.max_tokens == 1]

    def failures(self) -> list[str]:
        return [self.fail_with] if self.fail_with else []

    def start_stream(self, stream: PrefillStream) -> None:
        self._stream = stream
        self._next_arrival = self.now + self._random.expovariate(stream.requests_per_s)

    def stop_stream(self) -> None:
        self._stream = None
        self._next_arrival = float("inf")

    def close(self) -> None:
        return None

    def sleep(self, seconds: float) -> None:
        target = self.now + seconds
        while True:
            step_end = self._step_end if self._step_end is not None else float("inf")
            event = min(step_end, self._next_sync, self._next_arrival)
            if event > target:
                break
            self.now = event
            if event == self._next_sync:
                self.published = self.live_reading()
                self._next_sync += self.sync_s
            elif event == self._next_arrival:
                assert self._stream is not None
                length = self._random.randint(*self._stream.prompt_tokens)
                self.arriving.append(Request(f"s{next(self._ids)}", length, 1))
                self._next_arrival += self._random.expovariate(self._stream.requests_per_s)
                self._start_step_if_idle()
            else:
                self._finish_step()
        self.now = target

    # -- the engine ----------------------------------------------------------------------------
    def _start_step_if_idle(self) -> None:
        if self._step_end is None:
            self._start_step()

    def _start_step(self) -> None:
        self.running += self.arriving
        self.arriving = []
        if not self.running:
            self._step_end = None
            return
        self._in_step = list(self.running)
        batch = len(self._in_step)
        verify = max(r.drafts for r in self._in_step)
        prefill = sum(r.prompt for r in self._in_step if r.drafts < 0)
        ms = self.step_ms(batch, max(verify, 0)) + self.prefill_ms_per_token * prefill
        ms *= 1 + self.jitter * (2 * self._random.random() - 1)
        self._step_end = self.now + ms / 1000.0

    def _table_k(self) -> int:
        return self.k if self.k_at is None else max(0, self.k_at(len(self._in_step)))

    def _drafts_next(self, table_k: int) -> int:
        """The k of the drafts this step made, ``table_k`` the table's now: with no steps
        queued, the table's as the step ends, before the calls between the steps (vLLM's step
        drafts what the lookup said when it was scheduled: a k landing after it is read by the
        next step first); with some, the table's of ``queued_steps`` step ends ago."""
        ks = self._table_ks
        if self.queued_steps == 0 or not ks:
            return table_k
        return ks[1] if len(ks) == ks.maxlen else ks[0]

    def _finish_step(self) -> None:
        tokens = {r.ident: r.prompt if r.drafts < 0 else 1 + r.drafts for r in self._in_step}
        spec = {r.ident: [-1] * r.drafts for r in self._in_step if r.drafts > 0}
        verify = max((r.drafts for r in self._in_step), default=0)
        self.scheduled.append((len(tokens), max(verify, 0), sum(tokens.values())))
        for request in self._in_step:
            request.produced += 1
        self.running = [r for r in self.running if r.produced < r.max_tokens]
        drafted = self._drafts_next(self._table_k())
        self.timer.on_step(
            self.now, tokens, sum(tokens.values()), spec,
            idle_after=not self.running, drafts_next=drafted,
        )  # fmt: skip
        calls, self._at_step_end = self._at_step_end, []
        for call in calls:  # between this step and the next: they see it counted
            call()
        self._table_ks.append(self._table_k())
        # The drafter proposes the table's k of queued_steps ago (none queued: as it ended).
        for request in self._in_step:
            request.drafts = drafted if self.queued_steps == 0 else self._table_ks[0]
        if self.on_step is not None:
            self.on_step(self)
        self._start_step()


def metrics_text(reading: StepReading, *, engines: int = 1) -> str:
    """``reading`` as the plugin exports it on /metrics (its real families), per engine."""

    class Exported(Collector):
        def collect(self) -> Iterator[Metric]:
            yield from step_cell_families(
                EngineSteps(
                    ("m", str(i)),
                    reading.cells,
                    reading.steps_without_decode,
                    1.7e9,
                    reading.switch_steps,
                    0.01 * reading.switch_steps,
                )
                for i in range(engines)
            )

    registry = CollectorRegistry()
    registry.register(Exported())
    return generate_latest(registry).decode()
