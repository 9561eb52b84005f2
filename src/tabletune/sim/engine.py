"""EngineSim: vLLM's decode loop in simulated time. Pure: no HTTP, no wall clock, no globals.

Each step, every running request drafts ``k`` tokens and keeps a leading prefix of them: the
prefix is ``>= i`` with probability a_i (the acceptance process at that time). ``k`` comes from
the installed lookup, read once per step exactly as vLLM's scheduler reads
``dynamic_sd_lookup[batch_size]`` (a plain list, or the plugin's ``StepPolicy`` with exploration
and hysteresis), or from any ``choose_k(batch_size, step_index)`` callable.

Steps that share (B, a) run as one batch: the k sequence is read step by step (cheap), then the
accepted counts of all n*B drafts of one k are ONE multinomial draw, so a thousand engines cost
little. Counters follow vLLM 0.26 (per step with k > 0: num_drafts += B, num_draft_tokens += B*k,
accepted per position) and the plugin (draft tokens per position, batch-size and step-duration
histograms).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tabletune import metric_names as names
from tabletune.plugin.metrics_core import STEP_DURATION_BUCKETS
from tabletune.sim.processes import AcceptanceProcess, LoadProcess
from tabletune.solver import StepTimes, tau

ChooseK = Callable[[int, int], int]
MAX_STEPS_PER_BATCH = 20_000
NOISE_BLOCK = 4096
TRUTH_HISTORY = 720


class SimError(ValueError):
    """The emulated engine was asked for something it cannot do (e.g. k > K)."""


class Lookup(Protocol):
    """vLLM's ``dynamic_sd_lookup``: a list, or anything indexable by batch size."""

    def __getitem__(self, batch_size: int, /) -> int: ...


@dataclass
class DurationHistogram:
    counts: np.ndarray  # per bucket of STEP_DURATION_BUCKETS, then +Inf; not cumulative
    total_s: float = 0.0

    @classmethod
    def empty(cls) -> DurationHistogram:
        return cls(counts=np.zeros(len(STEP_DURATION_BUCKETS) + 1, dtype=np.int64))

    @property
    def count(self) -> int:
        return int(self.counts.sum())


@dataclass
class Counters:
    """Everything the engine has counted since it (re)started, as vLLM and the plugin do."""

    num_positions: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0
    accepted_per_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    draft_tokens_per_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    batch_size_counts: np.ndarray = field(
        default_factory=lambda: np.zeros(len(names.BATCH_SIZE_BUCKETS) + 1, dtype=np.int64)
    )
    batch_size_sum: int = 0
    step_durations: dict[tuple[int, str], DurationHistogram] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.accepted_per_pos.size == 0:
            self.accepted_per_pos = np.zeros(self.num_positions, dtype=np.int64)
        if self.draft_tokens_per_pos.size == 0:
            self.draft_tokens_per_pos = np.zeros(self.num_positions, dtype=np.int64)

    @property
    def num_accepted_tokens(self) -> int:
        return int(self.accepted_per_pos.sum())


@dataclass(frozen=True)
class StepBatch:
    """What a run of steps with one (B, a) did; handed to ``on_steps`` observers."""

    start_s: float
    end_s: float
    batch_size: int
    rates: tuple[float, ...]
    ks: np.ndarray  # k of each step, in order
    durations_s: np.ndarray
    drafted_per_pos: np.ndarray  # requests that drafted position i (1-based i = index + 1)
    accepted_per_pos: np.ndarray  # requests that kept position i
    tokens: int  # generated (kept guesses + one token per request per step)

    @property
    def steps(self) -> int:
        return int(self.ks.size)


@dataclass
class TruthInterval:
    """Ground truth over [start_s, end_s) of simulated time (tokens; goodput = tokens / s)."""

    start_s: float
    end_s: float
    steps: int = 0
    busy_s: float = 0.0
    request_steps: int = 0  # sum of B over steps
    tokens: int = 0  # realised generated tokens
    expected_tokens: float = 0.0  # sum of B * tau_true(k) over steps
    oracle_tokens: float = 0.0  # oracle goodput (best allowed k per B, true a) * busy time

    def as_dict(self, *, until: float | None = None) -> dict[str, float | int | None]:
        """As JSON; ``until`` cuts an interval still open at that time."""
        end = self.end_s if until is None else max(self.start_s, min(self.end_s, until))
        span = end - self.start_s
        return {
            "start_s": self.start_s,
            "end_s": end,
            "steps": self.steps,
            "busy_s": self.busy_s,
            "mean_batch_size": self.request_steps / self.steps if self.steps else 0.0,
            "tokens": self.tokens,
            "expected_tokens": self.expected_tokens,
            "oracle_tokens": self.oracle_tokens,
            "goodput_tokens_per_s": self.tokens / span if span > 0 else None,
            "expected_goodput_tokens_per_s": self.expected_tokens / span if span > 0 else None,
            "oracle_goodput_tokens_per_s": self.oracle_tokens / span if span > 0 else None,
            "efficiency": self.expected_tokens / self.oracle_tokens if self.oracle_tokens else None,
        }


def prefix_probabilities(rates: tuple[float, ...], k: int) -> np.ndarray:
    """P(kept prefix = j) for j = 0..k: a_j - a_{j+1}, with a_0 = 1 and a_{k+1} = 0."""
    a = np.concatenate(([1.0], np.asarray(rates[:k], dtype=float), [0.0]))
    p = np.clip(a[:-1] - a[1:], 0.0, None)
    total = float(p.sum())
    if total <= 0:
        p = np.zeros(k + 1)
        p[0] = 1.0
        return p
    result: np.ndarray = p / total
    return result


class EngineSim:
    """One emulated engine. Drive it with ``advance(dt_s)`` / ``advance_to(t)`` / ``step()``."""

    def __init__(
        self,
        *,
        step_times: StepTimes,
        load: LoadProcess,
        acceptance: AcceptanceProcess,
        num_speculative_tokens: int,
        max_num_seqs: int,
        lookup: Lookup | None = None,
        choose_k: ChooseK | None = None,
        oracle_ks: Iterable[int] | None = None,
        step_noise: float = 0.0,
        seed: int = 0,
        start_s: float = 0.0,
        truth_interval_s: float = 10.0,
    ) -> None:
        if max_num_seqs > step_times.max_batch:
            raise SimError(
                f"max_num_seqs={max_num_seqs} is beyond the profile "
                f"(up to B={step_times.max_batch})"
            )
        if step_noise < 0:
            raise SimError("step_noise must be >= 0")
        self.step_times = step_times
        self.load = load
        self.acceptance = acceptance
        self.num_speculative_tokens = num_speculative_tokens
        self.max_num_seqs = max_num_seqs
        self.lookup = lookup
        self.choose_k = choose_k
        self.step_noise = step_noise
        self.truth_interval_s = truth_interval_s
        self.rng = np.random.default_rng([seed, 0])  # acceptance draws
        self._noise_rng = np.random.default_rng([seed, 1])  # step-time noise
        self.now = start_s
        self.step_index = 0  # steps since the (re)start, as the engine counts them
        self.down_until = start_s
        self.counters = Counters(num_positions=num_speculative_tokens)
        self.on_steps: list[Callable[[StepBatch], None]] = []
        profiled = [k for k in step_times.ks if k <= num_speculative_tokens]
        self.oracle_ks = tuple(sorted(set(profiled if oracle_ks is None else oracle_ks)))
        if not self.oracle_ks or any(k not in step_times.ks for k in self.oracle_ks):
            raise SimError(f"oracle k {self.oracle_ks} must be profiled ({step_times.ks})")
        self._rows = self._step_rows()
        self._noise = np.ones(0)
        self._noise_at = 0
        self._oracle_cache: dict[tuple[int, tuple[float, ...]], tuple[int, float]] = {}
        start = (start_s // truth_interval_s) * truth_interval_s
        self.interval = TruthInterval(start_s=start, end_s=start + truth_interval_s)
        self.history: deque[TruthInterval] = deque(maxlen=TRUTH_HISTORY)

    # -- model -------------------------------------------------------------------------------

    def _step_rows(self) -> list[list[float]]:
        """Step time in seconds, ``rows[k][B]`` for k = 0..K, B = 0..max_num_seqs.

        A k that was not profiled (set with allow_uncaptured) runs as the next profiled k
        above it, or the longest one: it has no captured graph, so it is not cheaper.
        """
        dense = self.step_times.dense(self.max_num_seqs) / 1000.0
        rows = []
        for k in range(self.num_speculative_tokens + 1):
            above = [p for p in self.step_times.ks if p >= k]
            use = above[0] if above else self.step_times.ks[-1]
            row = dense[self.step_times.ks.index(use)]
            rows.append([float(row[0]), *(float(v) for v in row)])
        return rows

    def step_time_s(self, batch_size: int, k: int) -> float:
        return self._rows[k][batch_size]

    def running(self, t: float | None = None) -> int:
        """Requests in the batch (vLLM's num_requests_running) at time t (default now)."""
        if (self.now if t is None else t) < self.down_until:
            return 0
        return min(self.load.at(self.now if t is None else t), self.max_num_seqs)

    def waiting(self) -> int:
        if self.now < self.down_until:
            return 0
        return max(0, self.load.at(self.now) - self.max_num_seqs)

    def k_for(self, batch_size: int) -> int:
        """k of the next step without counting a step (for display: the table's own k)."""
        if self.lookup is None:
            return self.num_speculative_tokens
        table_k = getattr(self.lookup, "table_k", None)
        if callable(table_k):
            return int(table_k(batch_size))
        return int(self.lookup[batch_size])

    def goodput(self, batch_size: int, k: int, rates: tuple[float, ...]) -> float:
        """Expected kept tokens per second at (B, k) with acceptance ``rates``."""
        return batch_size * tau(rates, k) / self.step_time_s(batch_size, k)

    def best_k(self, batch_size: int, rates: tuple[float, ...]) -> tuple[int, float]:
        """The allowed k with the highest goodput at this load, and that goodput."""
        key = (batch_size, rates)
        found = self._oracle_cache.get(key)
        if found is None:
            if len(self._oracle_cache) > 4096:
                self._oracle_cache.clear()
            best = max(self.oracle_ks, key=lambda k: self.goodput(batch_size, k, rates))
            found = self._oracle_cache[key] = (best, self.goodput(batch_size, best, rates))
        return found

    # -- control -----------------------------------------------------------------------------

    def install(self, lookup: Lookup | None) -> None:
        """Replace the scheduler's lookup (the plugin's install); the next step uses it."""
        self.lookup = lookup

    def restart(self, *, downtime_s: float = 0.0) -> None:
        """vLLM restarts: every counter from zero, no steps for ``downtime_s``. The caller
        installs the starting table again (as vLLM builds it from its config)."""
        self.counters = Counters(num_positions=self.num_speculative_tokens)
        self.step_index = 0
        self.down_until = self.now + downtime_s

    # -- running -----------------------------------------------------------------------------

    def advance(self, dt_s: float) -> int:
        return self.advance_to(self.now + dt_s)

    def advance_to(self, target_s: float) -> int:
        """Run every step that starts before ``target_s``; returns how many ran.

        The last step may end a little after ``target_s`` (a step is counted when it starts).
        """
        ran = 0
        while self.now < target_s:
            self._roll_interval()
            if self.now < self.down_until:
                self._idle(min(self.down_until, target_s))
                continue
            load = self.load.at(self.now)
            boundary = min(
                target_s,
                self.load.next_change(self.now),
                self.acceptance.next_change(self.now),
                self.interval.end_s,
            )
            if boundary <= self.now:  # rounding at a change point: never stand still
                boundary = min(target_s, math.nextafter(self.now, math.inf))
            batch = min(load, self.max_num_seqs)
            if batch <= 0:
                self._idle(boundary)
                continue
            ran += self._run(batch, self.acceptance.at(self.now), boundary).steps
        self._roll_interval()
        return ran

    def step(self) -> StepBatch | None:
        """Exactly one step now (after idling to the next load change when no request runs);
        None when no request will ever run again."""
        while True:
            self._roll_interval()
            if self.now < self.down_until:
                self._idle(self.down_until)
                continue
            batch = min(self.load.at(self.now), self.max_num_seqs)
            if batch > 0:
                return self._run(batch, self.acceptance.at(self.now), self.now, single=True)
            following = self.load.next_change(self.now)
            if following == float("inf"):
                return None
            self._idle(following)

    def _idle(self, until: float) -> None:
        self.now = max(self.now, until)

    def _roll_interval(self) -> None:
        while self.now >= self.interval.end_s:
            self.history.append(self.interval)
            start = self.interval.end_s
            self.interval = TruthInterval(start_s=start, end_s=start + self.truth_interval_s)

    def _noise_ahead(self, count: int) -> np.ndarray:
        """The next ``count`` mean-one lognormal step-time factors, without using them up.

        They come from their own stream and are used up one per step (``_use_noise``), so step
        times do not depend on how steps were grouped into batches."""
        available = self._noise.size - self._noise_at
        if available < count:
            sigma = self.step_noise
            fresh = self._noise_rng.lognormal(
                -sigma * sigma / 2.0, sigma, max(NOISE_BLOCK, count - available)
            )
            self._noise = np.concatenate((self._noise[self._noise_at :], fresh))
            self._noise_at = 0
        return self._noise[self._noise_at : self._noise_at + count]

    def _use_noise(self, count: int) -> None:
        self._noise_at += count

    def _choose(self, batch: int) -> int:
        if self.choose_k is not None:
            k = int(self.choose_k(batch, self.step_index))
        elif self.lookup is None:
            k = self.num_speculative_tokens  # static num_speculative_tokens
        else:
            k = int(self.lookup[batch])
        if not 0 <= k <= self.num_speculative_tokens:
            raise SimError(
                f"step {self.step_index}: k={k} outside 0..K={self.num_speculative_tokens}"
            )
        return k

    def _run(
        self, batch: int, rates: tuple[float, ...], until: float, *, single: bool = False
    ) -> StepBatch:
        start = self.now
        if not single and self.choose_k is None and isinstance(self.lookup, list | tuple | None):
            k_array, durations = self._run_fixed(batch, until - start)
        else:
            k_array, durations = self._run_per_step(batch, until - start, single=single)
        self.now = start + float(durations.sum())
        outcome = self._count(batch, rates, k_array, durations, start)
        for observer in self.on_steps:
            observer(outcome)
        return outcome

    def _run_fixed(self, batch: int, budget_s: float) -> tuple[np.ndarray, np.ndarray]:
        """A plain lookup list gives the same k to every step at one batch size: the steps
        that start within ``budget_s`` are counted in one go, whatever their number."""
        k = self._choose(batch)
        seconds = self._rows[k][batch]
        if self.step_noise > 0:
            guess = min(MAX_STEPS_PER_BATCH, math.ceil(1.25 * budget_s / seconds) + 8)
            durations = seconds * self._noise_ahead(guess)
            ends = np.cumsum(durations)
            count = min(guess, int(np.searchsorted(ends, budget_s, side="left")) + 1)
            durations = durations[:count]
            self._use_noise(count)
        else:
            count = min(MAX_STEPS_PER_BATCH, max(1, math.ceil(budget_s / seconds - 1e-12)))
            durations = np.full(count, seconds)
        self.step_index += count
        return np.full(count, k, dtype=np.int64), durations

    def _run_per_step(
        self, batch: int, budget_s: float, *, single: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """Read k once per step (the plugin's StepPolicy or a ``choose_k`` policy)."""
        rows = self._rows
        ks: list[int] = []
        seconds: list[float] = []
        elapsed = 0.0
        noisy = self.step_noise > 0
        while True:
            k = self._choose(batch)
            self.step_index += 1
            duration = rows[k][batch]
            if noisy:
                duration *= float(self._noise_ahead(1)[0])
                self._use_noise(1)
            ks.append(k)
            seconds.append(duration)
            elapsed += duration
            if single or elapsed >= budget_s or len(ks) >= MAX_STEPS_PER_BATCH:
                break
        return np.asarray(ks, dtype=np.int64), np.asarray(seconds)

    def _count(
        self,
        batch: int,
        rates: tuple[float, ...],
        ks: np.ndarray,
        durations: np.ndarray,
        start: float,
    ) -> StepBatch:
        counters = self.counters
        big_k = self.num_speculative_tokens
        per_k = np.bincount(ks, minlength=big_k + 1)
        drafted = np.zeros(big_k, dtype=np.int64)
        accepted = np.zeros(big_k, dtype=np.int64)
        bucket = names.batch_bucket(batch)
        expected = 0.0
        for k in (int(i) for i in np.flatnonzero(per_k)):
            steps = int(per_k[k])
            requests = steps * batch
            expected += requests * tau(rates, k)
            if k > 0:
                counters.num_drafts += requests
                counters.num_draft_tokens += requests * k
                drafted[:k] += requests
                prefix = self.rng.multinomial(requests, prefix_probabilities(rates, k))
                # kept position i (0-based) <=> prefix length > i
                accepted[:k] += np.cumsum(prefix[::-1])[::-1][1:]
            histogram = counters.step_durations.get((k, bucket))
            if histogram is None:
                histogram = counters.step_durations[(k, bucket)] = DurationHistogram.empty()
            mine = durations[ks == k] if per_k.size > 1 else durations
            slots = np.searchsorted(STEP_DURATION_BUCKETS, mine, side="left")
            histogram.counts += np.bincount(slots, minlength=histogram.counts.size)
            histogram.total_s += float(mine.sum())
        steps_total = int(ks.size)
        tokens = steps_total * batch + int(accepted.sum())
        counters.accepted_per_pos += accepted
        counters.draft_tokens_per_pos += drafted
        counters.generation_tokens += tokens
        counters.steps += steps_total
        slot = int(np.searchsorted(names.BATCH_SIZE_BUCKETS, batch, side="left"))
        counters.batch_size_counts[slot] += steps_total
        counters.batch_size_sum += steps_total * batch
        busy = float(durations.sum())
        interval = self.interval
        interval.steps += steps_total
        interval.busy_s += busy
        interval.request_steps += steps_total * batch
        interval.tokens += tokens
        interval.expected_tokens += expected
        interval.oracle_tokens += self.best_k(batch, rates)[1] * busy
        return StepBatch(
            start_s=start,
            end_s=self.now,
            batch_size=batch,
            rates=rates,
            ks=ks,
            durations_s=durations,
            drafted_per_pos=drafted,
            accepted_per_pos=accepted,
            tokens=tokens,
        )
