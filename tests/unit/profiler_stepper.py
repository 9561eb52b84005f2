"""A step-level fake of vLLM + the plugin in virtual time, for the in-flight measurer's tests.

It is both the measurer's engine (``set_k_everywhere``, ``step_reading``) and its traffic
(``send``, ``stop_all``, a prefill stream). Steps run back to back while the test "sleeps": each
step schedules every running request (a new one prefills its prompt, the others verify the
drafts proposed at the previous step's end, which is when the table is read, as with async
scheduling), lasts ``step_ms(B, k)`` plus a prefill cost, and is handed to the plugin's real
``StepTimer``; its totals are published every ``sync_s`` (the HTTP side's sync), which is all
``step_reading`` sees through /metrics (an older plugin), or, with ``fresh``, read as of the last
finished step (the admin API's step-cells route asks the engine). Every guess is rejected: one
token per request per step.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tabletune.plugin.step_metrics import EngineSteps, step_cell_families
from tabletune.plugin.step_timer import StepTimer
from tabletune.profiler.prompts import Prompt
from tabletune.profiler.step_reading import StepReading
from tabletune.schemas.shape import PrefillStream

StepMs = Callable[[int, int], float]  # (B, verified k) -> ms


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

    # -- what the measurer calls ---------------------------------------------------------------
    def clock(self) -> float:
        return self.now

    def set_k_everywhere(self, k: int, max_num_seqs: int) -> None:
        self.k = k
        self.puts.append(k)

    @property
    def readings_fresh(self) -> bool:
        return self.fresh

    def step_reading(self) -> StepReading:
        self.reads += 1
        return self.live_reading() if self.fresh else self.published

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

    def _finish_step(self) -> None:
        tokens = {r.ident: r.prompt if r.drafts < 0 else 1 + r.drafts for r in self._in_step}
        spec = {r.ident: [-1] * r.drafts for r in self._in_step if r.drafts > 0}
        verify = max((r.drafts for r in self._in_step), default=0)
        self.scheduled.append((len(tokens), max(verify, 0), sum(tokens.values())))
        k = self.k if self.k_at is None else max(0, self.k_at(len(self._in_step)))
        for request in self._in_step:
            request.produced += 1
            request.drafts = k  # the drafter proposes the table's k for the next step
        self.running = [r for r in self.running if r.produced < r.max_tokens]
        self.timer.on_step(
            self.now, tokens, sum(tokens.values()), spec, idle_after=not self.running
        )
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
