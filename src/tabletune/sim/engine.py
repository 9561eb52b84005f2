"""EngineSim: vLLM's decode loop in simulated time. Pure: no HTTP, no wall clock, no globals.

Each step, every running request drafts ``k`` tokens and keeps a leading prefix of them: the
prefix is ``>= i`` with probability a_i (the acceptance process at that time). ``k`` comes from
the installed lookup, read once per step exactly as vLLM's scheduler reads
``dynamic_sd_lookup[batch_size]`` (a plain list, the plugin's ``StepPolicy`` with exploration
and hysteresis, or its ``NightjarLookup`` bandit, which learns from each step it counts in a
step-time cell, as the plugin's step timer hands them over), or from any
``choose_k(batch_size, step_index)`` callable.

Step time is the profile's T(B, k) (the truth is the profile), or, with a serving model, what
``tabletune.sim.serving`` makes of it under the traffic shape of the time: prefill riding along,
CUDA-graph misses above the capture limit, context cost (the truth is then that model, and the
profile the daemon is given is deliberately wrong). A step's time is that of the k it reads,
the drafts it makes (vLLM's step time follows those, not the drafts it verifies, which the
step before made: ``tabletune.plugin.step_timer``); so a step at another k than the step before
drafted another k than it verified, and is counted apart from the cells, as the plugin's
switch steps are.

Steps that share (B, a, shape) run as one batch: the k sequence is read step by step (cheap),
per-step prefill is drawn as vectors, then the accepted counts of all n*B drafts of one k are ONE
multinomial draw, so a thousand engines cost little. Counters follow vLLM 0.26 (per step with
k > 0: num_drafts += B, num_draft_tokens += B*k, accepted per position) and the plugin (draft
tokens per position, per-step timing cells of ``tabletune.step_cells``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tabletune.plugin.bandit import NightjarLookup
from tabletune.sim.draws import DrawStream, PrefillStream
from tabletune.sim.processes import AcceptanceProcess, LoadProcess, TrafficProcess
from tabletune.sim.serving import ServingModel, TrafficShape
from tabletune.sim.step_model import StepModel
from tabletune.solver import Solution, StepTimes, build_table, tau
from tabletune.step_cells import CellKey, CellTotals, cell_key

ChooseK = Callable[[int, int], int]
MAX_STEPS_PER_BATCH = 20_000
TRUTH_HISTORY = 720


class SimError(ValueError):
    """The emulated engine was asked for something it cannot do (e.g. k > K)."""


class Lookup(Protocol):
    """vLLM's ``dynamic_sd_lookup``: a list, or anything indexable by batch size."""

    def __getitem__(self, batch_size: int, /) -> int: ...


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
    # Per step-time cell: steps, seconds, seconds squared, scheduled tokens, scheduled requests.
    cells: dict[CellKey, np.ndarray] = field(default_factory=dict)
    # Every emulated step decodes (B >= 1 requests; prefill rides along): always 0.
    steps_without_decode: int = 0
    # Steps at another k than the step before (they drafted another k than they verified),
    # kept out of the cells as the plugin does.
    switch_steps: int = 0
    switch_seconds: float = 0.0
    last_k: int | None = None

    def __post_init__(self) -> None:
        if self.accepted_per_pos.size == 0:
            self.accepted_per_pos = np.zeros(self.num_positions, dtype=np.int64)
        if self.draft_tokens_per_pos.size == 0:
            self.draft_tokens_per_pos = np.zeros(self.num_positions, dtype=np.int64)

    @property
    def num_accepted_tokens(self) -> int:
        return int(self.accepted_per_pos.sum())

    def step_cells(self) -> dict[CellKey, CellTotals]:
        """The cells' totals, as the plugin's ``StepCellCounter.totals()`` gives them."""
        return {key: CellTotals(*(float(v) for v in sums)) for key, sums in self.cells.items()}


@dataclass(frozen=True)
class StepBatch:
    """What a run of steps with one (B, a) did; handed to ``on_steps`` observers."""

    start_s: float
    end_s: float
    batch_size: int
    rates: tuple[float, ...]
    ks: np.ndarray  # k of each step, in order
    durations_s: np.ndarray
    scheduled_tokens: np.ndarray  # per step: B * (1 + k) + prefill tokens
    drafted_per_pos: np.ndarray  # requests that drafted position i (1-based i = index + 1)
    accepted_per_pos: np.ndarray  # requests that kept position i
    tokens: int  # generated (kept guesses + one token per request per step)
    timed: np.ndarray  # per step: counted in its step-time cell (not a switch step)

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
        serving: ServingModel | None = None,
        traffic: TrafficProcess | None = None,
    ) -> None:
        if max_num_seqs > step_times.max_batch:
            raise SimError(
                f"max_num_seqs={max_num_seqs} is beyond the profile "
                f"(up to B={step_times.max_batch})"
            )
        if step_noise < 0:
            raise SimError("step_noise must be >= 0")
        if (serving is None) != (traffic is None):
            raise SimError("a serving model needs a traffic process, and a traffic process one")
        if (
            serving is not None
            and serving.prefill_budget(max_num_seqs * (1 + num_speculative_tokens)) < 0
        ):
            raise SimError("max_num_batched_tokens is below max_num_seqs * (1 + K)")
        self.step_times = step_times
        self.load = load
        self.acceptance = acceptance
        self.serving = serving
        self.traffic = traffic
        self.num_speculative_tokens = num_speculative_tokens
        self.max_num_seqs = max_num_seqs
        self.lookup = lookup
        self.choose_k = choose_k
        self.step_noise = step_noise
        self.truth_interval_s = truth_interval_s
        self.rng = np.random.default_rng([seed, 0])  # acceptance draws
        sigma = step_noise  # mean-one lognormal step-time factors, one per step
        self._noise = DrawStream(
            np.random.default_rng([seed, 1]),
            lambda rng, n: rng.lognormal(-sigma * sigma / 2.0, sigma, n),
        )
        self._prefill = PrefillStream(
            np.random.default_rng([seed, 2]), np.random.default_rng([seed, 3])
        )
        self.now = start_s
        self.step_index = 0  # steps since the (re)start, as the engine counts them
        self.down_until = start_s
        self.counters = Counters(num_positions=num_speculative_tokens)
        self.on_steps: list[Callable[[StepBatch], None]] = []
        profiled = [k for k in step_times.ks if k <= num_speculative_tokens]
        self.oracle_ks = tuple(sorted(set(profiled if oracle_ks is None else oracle_ks)))
        if not self.oracle_ks or any(k not in step_times.ks for k in self.oracle_ks):
            raise SimError(f"oracle k {self.oracle_ks} must be profiled ({step_times.ks})")
        self.model = StepModel(
            step_times,
            num_speculative_tokens=num_speculative_tokens,
            max_num_seqs=max_num_seqs,
            serving=serving,
        )
        self._oracle_cache: dict[
            tuple[int, tuple[float, ...], TrafficShape | None], tuple[int, float]
        ] = {}
        start = (start_s // truth_interval_s) * truth_interval_s
        self.interval = TruthInterval(start_s=start, end_s=start + truth_interval_s)
        self.history: deque[TruthInterval] = deque(maxlen=TRUTH_HISTORY)

    # -- model -------------------------------------------------------------------------------

    def step_time_s(self, batch_size: int, k: int) -> float:
        """The profile's T(B, k): what the daemon is given, not necessarily the truth."""
        return self.model.profile_lists[k][batch_size]

    def shape(self, t: float | None = None) -> TrafficShape | None:
        """The traffic shape at time t (default now); None without a serving model."""
        return None if self.traffic is None else self.traffic.at(self.now if t is None else t)

    def _now_rates(self, rates: tuple[float, ...] | None) -> tuple[float, ...]:
        return self.acceptance.at(self.now) if rates is None else rates

    def true_step_s(
        self,
        batch_size: int,
        k: int,
        rates: tuple[float, ...] | None = None,
        shape: TrafficShape | None = None,
    ) -> float:
        """The TRUE expected step time at (B, k) under the acceptance and the traffic shape
        (defaults: those of now). Without a serving model it is the profile's."""
        shape = shape if shape is not None else self.shape()
        return float(self.model.true_rows(self._now_rates(rates), shape)[k, batch_size])

    def true_step_times(
        self, rates: tuple[float, ...] | None = None, shape: TrafficShape | None = None
    ) -> StepTimes:
        """The true expected T(B, k) for B = 1..max_num_seqs and the profiled k, as the solver
        takes step times (``build_table``, ``evaluate_table``)."""
        shape = shape if shape is not None else self.shape()
        return self.model.true_step_times(self._now_rates(rates), shape)

    def oracle_table(
        self, rates: tuple[float, ...] | None = None, shape: TrafficShape | None = None
    ) -> Solution:
        """The truth-optimal table (the allowed k only) for the acceptance and shape (now)."""
        rates = self._now_rates(rates)
        return build_table(
            self.true_step_times(rates, shape),
            rates,
            allowed_k=self.oracle_ks,
            max_batch=self.max_num_seqs,
        )

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

    def goodput(
        self,
        batch_size: int,
        k: int,
        rates: tuple[float, ...],
        shape: TrafficShape | None = None,
    ) -> float:
        """Expected kept tokens per second at (B, k) with acceptance ``rates`` (true T)."""
        return batch_size * tau(rates, k) / self.true_step_s(batch_size, k, rates, shape)

    def best_k(
        self, batch_size: int, rates: tuple[float, ...], shape: TrafficShape | None = None
    ) -> tuple[int, float]:
        """The allowed k with the highest true goodput at this load, and that goodput."""
        shape = shape if shape is not None else self.shape()
        key = (batch_size, rates, shape)
        found = self._oracle_cache.get(key)
        if found is None:
            if len(self._oracle_cache) > 4096:
                self._oracle_cache.clear()
            best = max(self.oracle_ks, key=lambda k: self.goodput(batch_size, k, rates, shape))
            found = self._oracle_cache[key] = (best, self.goodput(batch_size, best, rates, shape))
        return found

    # -- control -----------------------------------------------------------------------------

    def install(self, lookup: Lookup | None) -> None:
        """Replace the scheduler's lookup (the plugin's install); the next step uses it."""
        self.lookup = lookup

    def restart(self, *, downtime_s: float = 0.0) -> None:
        """vLLM restarts: every counter from zero, no steps for ``downtime_s``, no prefill
        waiting. The caller installs the starting table again (as vLLM builds it)."""
        self.counters = Counters(num_positions=self.num_speculative_tokens)
        self.step_index = 0
        self.down_until = self.now + downtime_s
        self._prefill.backlog = 0

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
                math.inf if self.traffic is None else self.traffic.next_change(self.now),
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
        shape = self.shape(start)
        # The bandit learns from each step before it chooses the next: one step at a time.
        lookup = self.lookup
        bandit = lookup if isinstance(lookup, NightjarLookup) and self.choose_k is None else None
        single = single or bandit is not None
        if not single and self.choose_k is None and isinstance(self.lookup, list | tuple | None):
            ks, durations, tokens = self._run_fixed(batch, rates, shape, until - start)
        else:
            ks, durations, tokens = self._run_per_step(
                batch, rates, shape, until - start, single=single
            )
        self.now = start + float(durations.sum())
        outcome = self._count(batch, rates, shape, ks, durations, tokens, start)
        if bandit is not None and outcome.timed[0]:
            # As the plugin's step timer hands over the steps it put in their cells.
            bandit.learn(batch, int(ks[0]), outcome.tokens, float(durations[0]))
        for observer in self.on_steps:
            observer(outcome)
        return outcome

    def _run_fixed(
        self, batch: int, rates: tuple[float, ...], shape: TrafficShape | None, budget_s: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A plain lookup list gives the same k to every step at one batch size: the steps
        that start within ``budget_s`` are counted in one go, whatever their number."""
        k = self._choose(batch)
        seconds = self.model.profile_lists[k][batch]
        decode = batch * (1 + k)
        if shape is None and self.step_noise == 0:
            count = min(MAX_STEPS_PER_BATCH, max(1, math.ceil(budget_s / seconds - 1e-12)))
            self.step_index += count
            return (
                np.full(count, k, dtype=np.int64),
                np.full(count, seconds),
                np.full(count, decode, dtype=np.int64),
            )
        # Profile time is the shortest a step can be (before noise): enough steps to look at.
        guess = min(MAX_STEPS_PER_BATCH, math.ceil(1.25 * budget_s / seconds) + 8)
        durations = np.full(guess, seconds)
        tokens = np.full(guess, decode, dtype=np.int64)
        if shape is not None:
            assert self.serving is not None
            constants = self.model.batch(batch, rates, shape)
            served, arrivals, backlog = self._prefill.ahead(
                guess, constants.arrival_cdfs[k], shape, constants.room[k]
            )
            durations = self.serving.step_seconds(
                constants.base_s[k], served, constants.miss_above[k], constants.attention_s[k]
            )
            tokens = tokens + served
        if self.step_noise > 0:
            durations = durations * self._noise.peek(guess)
        ends = np.cumsum(durations)
        count = min(guess, int(np.searchsorted(ends, budget_s, side="left")) + 1)
        if self.step_noise > 0:
            self._noise.use(count)
        if shape is not None:
            self._prefill.use(count, arrivals, backlog)
        self.step_index += count
        return np.full(count, k, dtype=np.int64), durations[:count], tokens[:count]

    def _run_per_step(
        self,
        batch: int,
        rates: tuple[float, ...],
        shape: TrafficShape | None,
        budget_s: float,
        *,
        single: bool,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Read k once per step (the plugin's StepPolicy or a ``choose_k`` policy)."""
        rows = self.model.profile_lists
        ks: list[int] = []
        seconds: list[float] = []
        prefill: list[int] = []
        elapsed = 0.0
        noisy = self.step_noise > 0
        cursor = None
        if shape is not None:
            assert self.serving is not None
            step_seconds = self.serving.step_seconds
            constants = self.model.batch(batch, rates, shape)
            base, miss, attention = constants.base_s, constants.miss_above, constants.attention_s
            room, cdfs = constants.room, constants.arrival_cdf_lists
            cursor = self._prefill.cursor(shape)
        while True:
            k = self._choose(batch)
            self.step_index += 1
            if cursor is None:
                duration = rows[k][batch]
            else:
                served = cursor.next(cdfs[k], room[k])
                prefill.append(served)
                duration = step_seconds(base[k], served, miss[k], attention[k])
            if noisy:
                duration *= float(self._noise.peek(1)[0])
                self._noise.use(1)
            ks.append(k)
            seconds.append(duration)
            elapsed += duration
            if single or elapsed >= budget_s or len(ks) >= MAX_STEPS_PER_BATCH:
                break
        k_array = np.asarray(ks, dtype=np.int64)
        tokens = batch * (1 + k_array)
        if cursor is not None:
            cursor.commit()
            tokens += np.asarray(prefill, dtype=np.int64)
        return k_array, np.asarray(seconds), tokens

    def _count(
        self,
        batch: int,
        rates: tuple[float, ...],
        shape: TrafficShape | None,
        ks: np.ndarray,
        durations: np.ndarray,
        tokens_per_step: np.ndarray,
        start: float,
    ) -> StepBatch:
        counters = self.counters
        big_k = self.num_speculative_tokens
        per_k = np.bincount(ks, minlength=big_k + 1)
        timed = per_k.copy()  # steps that go into the cells: switch steps do not (plugin rule)
        seconds: np.ndarray
        squares: np.ndarray
        scheduled: np.ndarray
        first_switch = counters.last_k is not None and int(ks[0]) != counters.last_k
        counters.last_k = int(ks[-1])
        if int(per_k.max()) == ks.size and not first_switch:  # one k, no switch: plain sums
            keep = np.ones(ks.size, dtype=bool)
            only = per_k > 0
            seconds = only * float(durations.sum())
            squares = only * float(durations @ durations)
            scheduled = only * float(tokens_per_step.sum())
        else:
            switch = np.empty(ks.size, dtype=bool)
            switch[0] = first_switch
            switch[1:] = ks[1:] != ks[:-1]
            counters.switch_steps += int(switch.sum())
            counters.switch_seconds += float(durations[switch].sum())
            keep = ~switch
            kept_ks, kept_s = ks[keep], durations[keep]
            timed = np.bincount(kept_ks, minlength=big_k + 1)
            seconds = np.bincount(kept_ks, weights=kept_s, minlength=big_k + 1)
            squares = np.bincount(kept_ks, weights=kept_s * kept_s, minlength=big_k + 1)
            scheduled = np.bincount(kept_ks, weights=tokens_per_step[keep], minlength=big_k + 1)
        drafted = np.zeros(big_k, dtype=np.int64)
        accepted = np.zeros(big_k, dtype=np.int64)
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
            if not timed[k]:
                continue
            key = cell_key(k, batch)
            sums = counters.cells.get(key)
            if sums is None:
                sums = counters.cells[key] = np.zeros(5)
            sums += (timed[k], seconds[k], squares[k], scheduled[k], int(timed[k]) * batch)
        steps_total = int(ks.size)
        tokens = steps_total * batch + int(accepted.sum())
        counters.accepted_per_pos += accepted
        counters.draft_tokens_per_pos += drafted
        counters.generation_tokens += tokens
        counters.steps += steps_total
        busy = float(durations.sum())
        interval = self.interval
        interval.steps += steps_total
        interval.busy_s += busy
        interval.request_steps += steps_total * batch
        interval.tokens += tokens
        interval.expected_tokens += expected
        interval.oracle_tokens += self.best_k(batch, rates, shape)[1] * busy
        return StepBatch(
            start_s=start,
            end_s=self.now,
            batch_size=batch,
            rates=rates,
            ks=ks,
            durations_s=durations,
            scheduled_tokens=tokens_per_step,
            drafted_per_pos=drafted,
            accepted_per_pos=accepted,
            tokens=tokens,
            timed=keep,
        )
