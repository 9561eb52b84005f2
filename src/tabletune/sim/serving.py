"""The serving model: why a step under real traffic is not the profile's pure-decode T(B, k).

Pure maths (no state, no randomness of its own). A MODEL, not a measurement: its parameters are
set so that it shows, qualitatively, what a real H200 showed under serving traffic (docs/sim.md).

Per step with B decoding requests verifying k drafts and ``p`` prefill tokens riding along::

    decode tokens    D = B * (1 + k)
    scheduled tokens D + p                                  (p <= max_num_batched_tokens - D)
    base             T_profile(B, k) * (1 + context_cost * mean_context / context_ref_tokens)
    attention        attention_s_per_context_token * B * mean_context      (the same at every k)
    step time        (base + prefill_s_per_token * p) * (graph_miss_factor if D + p > limit else 1)
                     + attention

Traffic is closed-loop: requests finish at the rate they produce tokens, B * tau(k) / E[output]
per step, and each is replaced by a new one whose prompt is prefilled in the next steps. The
number of arrivals per step is Poisson with that mean, each arrival's prompt is drawn from the
prompt-length distribution, and prefill beyond the step's token budget waits for the next step.

The expected step time has a closed form. Prefill only matters through its mean (the budget
delays tokens, it does not drop them: E[p] = E[arrival tokens]) and through the chance that the
step stays under the graph limit, which needs the distribution of arrival tokens up to the
limit only: P(S_n <= x) for n prompts does not depend on B, k or the acceptance, so it is
tabulated once per shape and weighted by the Poisson probabilities of n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

# Below this many tokens a P(S_n <= limit) row is zero to double precision: no more rows.
TAIL_FLOOR = 1e-18
POISSON_TAIL_SIGMAS = 12.0

Number = TypeVar("Number", float, np.ndarray)


@dataclass(frozen=True, eq=False)
class Lengths:
    """A distribution of token counts: ``pmf[n]`` = P(length = n), n = 0..max (pmf[0] = 0)."""

    pmf: np.ndarray
    cdf: np.ndarray = field(init=False, repr=False)
    mean: float = field(init=False)
    mean_square: float = field(init=False)

    def __post_init__(self) -> None:
        pmf = np.asarray(self.pmf, dtype=float)
        if pmf.ndim != 1 or pmf.size < 2 or pmf[0] != 0 or np.any(pmf < 0):
            raise ValueError("a length pmf needs P(0) = 0 and non-negative P(n) for n >= 1")
        pmf = pmf / pmf.sum()
        tokens = np.arange(pmf.size, dtype=float)
        pmf.setflags(write=False)
        cdf = np.cumsum(pmf)
        cdf[-1] = 1.0
        cdf.setflags(write=False)
        object.__setattr__(self, "pmf", pmf)
        object.__setattr__(self, "cdf", cdf)
        object.__setattr__(self, "mean", float(pmf @ tokens))
        object.__setattr__(self, "mean_square", float(pmf @ (tokens * tokens)))

    @classmethod
    def constant(cls, tokens: int) -> Lengths:
        pmf = np.zeros(tokens + 1)
        pmf[tokens] = 1.0
        return cls(pmf)

    @classmethod
    def uniform(cls, low: int, high: int) -> Lengths:
        """Every whole number of tokens in low..high (inclusive) equally likely."""
        pmf = np.zeros(high + 1)
        pmf[low:] = 1.0
        return cls(pmf)

    @classmethod
    def lognormal(cls, median: float, sigma: float, maximum: int) -> Lengths:
        """exp(N(ln median, sigma^2)) rounded to whole tokens, clipped to 1..maximum (the mass
        beyond a bound piles up on it, as a length limit does)."""
        edges = np.arange(1, maximum, dtype=float) + 0.5  # between n and n + 1
        z = (np.log(edges) - math.log(median)) / (sigma * math.sqrt(2.0))
        below = 0.5 * (1.0 + np.asarray(np.frompyfunc(math.erf, 1, 1)(z), dtype=float))
        cdf = np.concatenate(([0.0], below, [1.0]))
        return cls(np.diff(cdf, prepend=0.0))

    @property
    def maximum(self) -> int:
        return self.pmf.size - 1

    def sample(self, uniforms: np.ndarray) -> np.ndarray:
        """Lengths for uniforms in [0, 1) (inverse CDF: the same draws give the same lengths)."""
        found = np.searchsorted(self.cdf, uniforms, side="right")
        result: np.ndarray = np.minimum(found, self.maximum)
        return result


@dataclass(frozen=True, eq=False)
class TrafficShape:
    """What requests look like: prompt and output lengths (independent)."""

    name: str
    prompt: Lengths
    output: Lengths
    _tails: dict[int, tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def mean_context(self) -> float:
        """Mean context of a decoding request: its prompt plus the tokens it generated so far.

        A request is in the batch for a time proportional to its output length O, and has
        generated O/2 on average meanwhile: E[O^2] / (2 E[O]) (length-biased)."""
        return self.prompt.mean + self.output.mean_square / (2.0 * self.output.mean)

    def arrivals_per_step(self, batch_size: Number, tau: Number) -> Number:
        """Closed loop: requests finishing (and replaced) per step, B * tau / E[output]."""
        per_step: Number = batch_size * tau / self.output.mean
        return per_step

    def lower_tail(self, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """``(below, mass)``, rows n = 0, 1, ... prompts, columns x = 0..limit:
        ``below[n, x]`` = P(S_n <= x) and ``mass[n, x]`` = E[S_n; S_n <= x], S_n the tokens of n
        prompts. Rows stop where P(S_n <= limit) is zero to double precision. Cached."""
        found = self._tails.get(limit)
        if found is not None:
            return found
        head = self.prompt.pmf[: limit + 1]
        tokens = np.arange(limit + 1, dtype=float)
        rows = [np.eye(1, limit + 1)[0]]  # S_0 = 0
        while len(rows) <= limit:
            pmf = np.convolve(rows[-1], head)[: limit + 1]
            if pmf.sum() < TAIL_FLOOR:
                break
            rows.append(pmf)
        pmfs = np.vstack(rows)
        below = np.cumsum(pmfs, axis=1)
        mass = np.cumsum(pmfs * tokens, axis=1)
        self._tails[limit] = (below, mass)
        return below, mass


def poisson_pmf(means: np.ndarray, count: int) -> np.ndarray:
    """P(N = n) for n = 0..count-1 (rows) and each mean > 0 (columns); log space, so large
    means do not underflow."""
    n = np.arange(count, dtype=float)[:, None]
    log_factorial = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, count)))))[:, None]
    lam = np.maximum(np.asarray(means, dtype=float), 1e-300)[None, :]  # log(0) would be nan
    result: np.ndarray = np.exp(n * np.log(lam) - lam - log_factorial)
    return result


def poisson_cdf(mean: float) -> np.ndarray:
    """P(N <= n) for n = 0 .. mean + 12 sd (+20): inverse-CDF draws of arrivals per step."""
    count = int(mean + POISSON_TAIL_SIGMAS * math.sqrt(mean) + 20)
    return np.cumsum(poisson_pmf(np.array([mean]), count)[:, 0])


def arrival_tokens(arrivals: np.ndarray, prompts: np.ndarray) -> np.ndarray:
    """Prompt tokens per step: step i gets the next ``arrivals[i]`` of ``prompts`` in order."""
    sums = np.concatenate(([0], np.cumsum(prompts, dtype=np.int64)))
    ends = np.cumsum(arrivals, dtype=np.int64)
    result: np.ndarray = sums[ends] - sums[ends - arrivals]
    return result


def chunked_prefill(
    arrivals: np.ndarray, budget: int, backlog: int
) -> tuple[np.ndarray, np.ndarray]:
    """Prefill tokens served per step and the backlog after each step, when at most ``budget``
    prefill tokens fit in a step and the rest waits (first come, first served).

    Lindley's recursion q_n = max(0, q_{n-1} + a_n - budget), solved without a loop:
    q_n = s_n - min(-q_0, min_{j<=n} s_j) with s_n = sum_{i<=n} (a_i - budget)."""
    excess = np.cumsum(np.asarray(arrivals, dtype=np.int64) - budget)
    after = excess - np.minimum(np.minimum.accumulate(excess), -backlog)
    before = np.concatenate(([backlog], after[:-1]))
    served: np.ndarray = before + arrivals - after
    return served, after


@dataclass(frozen=True)
class ServingModel:
    """The step-time model's parameters (defaults: docs/sim.md, "The serving model")."""

    graph_limit_tokens: int = 512
    graph_miss_factor: float = 1.8
    graph_misses_in_profile: bool = False
    prefill_s_per_token: float = 8e-6
    context_cost: float = 0.0
    context_ref_tokens: float = 1024.0
    max_num_batched_tokens: int = 8192
    attention_s_per_context_token: float = 0.0

    def context_factor(self, shape: TrafficShape) -> float:
        return 1.0 + self.context_cost * shape.mean_context / self.context_ref_tokens

    def attention_seconds(self, batch_size: Number, shape: TrafficShape) -> Number:
        """Decode attention over long contexts: each request's KV cache is read once a step for
        all its 1 + k positions (bound by memory bandwidth), so the cost is the same at every k
        and a graph miss (launch overhead) does not scale it."""
        seconds: Number = self.attention_s_per_context_token * shape.mean_context * batch_size
        return seconds

    def miss_above(self, decode_tokens: np.ndarray) -> np.ndarray:
        """Prefill tokens above which a step with ``decode_tokens`` leaves the CUDA graphs.

        Negative: it always does. Infinite: never more than the profile already shows (a
        profile measured on the engine holds the pure-decode misses above the limit)."""
        room = (self.graph_limit_tokens - np.asarray(decode_tokens)).astype(float)
        if self.graph_misses_in_profile:
            room[room < 0] = math.inf
        return room

    def prefill_budget(self, decode_tokens: Number) -> Number:
        """Prefill tokens that fit next to the decode tokens (chunked prefill)."""
        return self.max_num_batched_tokens - decode_tokens

    def step_seconds(
        self, base_s: float, prefill: Number, miss_above: float, attention_s: float = 0.0
    ) -> Number:
        """The step time; works on floats and on arrays alike (one formula for both paths)."""
        extra = (self.graph_miss_factor - 1.0) * (prefill > miss_above)
        return (base_s + self.prefill_s_per_token * prefill) * (1.0 + extra) + attention_s

    def expected_step_seconds(
        self,
        base_s: np.ndarray,
        arrivals_per_step: np.ndarray,
        miss_above: np.ndarray,
        shape: TrafficShape,
        attention_s: np.ndarray | float = 0.0,
    ) -> np.ndarray:
        """E[step time] over the per-step prefill, elementwise (e.g. over B for one k)."""
        base_s = np.asarray(base_s, dtype=float)
        lam = np.asarray(arrivals_per_step, dtype=float)
        x = np.asarray(miss_above, dtype=float)
        mean_prefill = lam * shape.prompt.mean
        under = np.zeros_like(lam)  # P(step stays under the graph limit)
        under_mass = np.zeros_like(lam)  # E[prefill; under the limit]
        never = np.isinf(x)
        under[never], under_mass[never] = 1.0, mean_prefill[never]
        some = (x >= 0) & ~never
        if np.any(some):
            below, mass = shape.lower_tail(self.graph_limit_tokens)
            columns = x[some].astype(np.int64)
            weights = poisson_pmf(lam[some], below.shape[0])  # (n, step)
            under[some] = np.einsum("ni,ni->i", weights, below[:, columns])
            under_mass[some] = np.einsum("ni,ni->i", weights, mass[:, columns])
        extra = self.graph_miss_factor - 1.0
        missed = base_s * (1.0 - under) + self.prefill_s_per_token * (mean_prefill - under_mass)
        plain = base_s + self.prefill_s_per_token * mean_prefill + extra * missed
        result: np.ndarray = plain + attention_s
        return result

    def worst_prefill_share(self, max_batch: int, big_k: int, shape: TrafficShape) -> float:
        """Prefill tokens arriving per step at the heaviest load (B = max_num_seqs, k = K,
        every draft kept) over the budget they have: must stay below 1, or the backlog grows
        without bound (the engine would be prefill-bound, and B not the decode batch)."""
        decode = max_batch * (1 + big_k)
        room = self.prefill_budget(decode)
        demand = shape.arrivals_per_step(float(max_batch), float(1 + big_k)) * shape.prompt.mean
        return math.inf if room <= 0 else demand / room
