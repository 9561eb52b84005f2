"""What a step costs: the profile's T(B, k), or, with a serving model, T under the traffic shape
of the time; and the TRUE expected T the oracle scores with. Pure (caches only, no draws).

Without a serving model the truth is the profile. With one, the profile stays what the daemon is
given (pure decode) and the truth is ``tabletune.sim.serving``'s expectation over the per-step
prefill, computed once per (acceptance, shape) for every (B, k) and cached.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tabletune.sim.serving import ServingModel, TrafficShape, poisson_cdf
from tabletune.solver import StepTimes, tau

TRUTH_CACHE = 256
BATCH_CACHE = 4096


@dataclass(frozen=True)
class ServingInputs:
    """The serving model's per-step constants for (k, B) pairs (arrays broadcast together)."""

    base_s: np.ndarray  # T_profile(B, k) x context factor
    attention_s: np.ndarray  # decode attention over the mean context (the same at every k)
    arrivals: np.ndarray  # mean arrivals per step (closed loop)
    miss_above: np.ndarray  # prefill tokens above which the step leaves the CUDA graphs
    room: np.ndarray  # prefill tokens that fit beside the decode tokens


@dataclass(frozen=True)
class BatchConstants:
    """The per-step constants at one (B, rates, shape), indexed by k: plain lists, read once a
    step, and each k's arrival CDF (as an array for vectors, as a list for single steps)."""

    base_s: list[float]
    attention_s: list[float]
    miss_above: list[float]
    room: list[int]
    arrival_cdfs: list[np.ndarray]
    arrival_cdf_lists: list[list[float]]


class StepModel:
    """Step times of one engine (K and max_num_seqs fixed), with or without a serving model."""

    def __init__(
        self,
        step_times: StepTimes,
        *,
        num_speculative_tokens: int,
        max_num_seqs: int,
        serving: ServingModel | None = None,
    ) -> None:
        self.step_times = step_times
        self.num_speculative_tokens = num_speculative_tokens
        self.max_num_seqs = max_num_seqs
        self.serving = serving
        self.profile_rows = self._profile_rows()
        self.profile_lists: list[list[float]] = self.profile_rows.tolist()  # fast scalar reads
        self._truth: dict[tuple[tuple[float, ...], TrafficShape], np.ndarray] = {}
        self._batches: dict[tuple[int, tuple[float, ...], TrafficShape], BatchConstants] = {}

    def _profile_rows(self) -> np.ndarray:
        """The profile's step time in seconds, ``rows[k, B]`` for k = 0..K, B = 0..max_num_seqs.

        A k that was not profiled (set with allow_uncaptured) runs as the next profiled k
        above it, or the longest one: it has no captured graph, so it is not cheaper.
        """
        times = self.step_times
        dense = times.dense(self.max_num_seqs) / 1000.0
        rows = np.empty((self.num_speculative_tokens + 1, self.max_num_seqs + 1))
        for k in range(self.num_speculative_tokens + 1):
            above = [p for p in times.ks if p >= k]
            row = dense[times.ks.index(above[0] if above else times.ks[-1])]
            rows[k] = np.concatenate(([row[0]], row))
        rows.setflags(write=False)
        return rows

    def inputs(
        self,
        ks: np.ndarray,
        batch_sizes: np.ndarray,
        rates: tuple[float, ...],
        shape: TrafficShape,
    ) -> ServingInputs:
        model = self.serving
        assert model is not None, "serving inputs without a serving model"
        k, batch = np.broadcast_arrays(np.asarray(ks), np.asarray(batch_sizes))
        taus = np.array([tau(rates, i) for i in range(self.num_speculative_tokens + 1)])
        decode = batch * (1 + k)
        return ServingInputs(
            base_s=self.profile_rows[k, batch] * model.context_factor(shape),
            attention_s=model.attention_seconds(batch.astype(float), shape),
            arrivals=shape.arrivals_per_step(batch.astype(float), taus[k]),
            miss_above=model.miss_above(decode),
            room=model.prefill_budget(decode),
        )

    def batch(self, batch: int, rates: tuple[float, ...], shape: TrafficShape) -> BatchConstants:
        key = (batch, rates, shape)
        found = self._batches.get(key)
        if found is None:
            if len(self._batches) >= BATCH_CACHE:
                self._batches.clear()
            ks = np.arange(self.num_speculative_tokens + 1)
            inputs = self.inputs(ks, np.array(batch), rates, shape)
            cdfs = [poisson_cdf(mean) for mean in inputs.arrivals.tolist()]
            found = self._batches[key] = BatchConstants(
                base_s=inputs.base_s.tolist(),
                attention_s=inputs.attention_s.tolist(),
                miss_above=inputs.miss_above.tolist(),
                room=inputs.room.tolist(),
                arrival_cdfs=cdfs,
                arrival_cdf_lists=[cdf.tolist() for cdf in cdfs],
            )
        return found

    def true_rows(self, rates: tuple[float, ...], shape: TrafficShape | None) -> np.ndarray:
        """Expected step time in seconds, ``rows[k, B]``: the profile's, or the serving model's
        expectation over the per-step prefill under ``shape`` (cached per rates and shape)."""
        if self.serving is None or shape is None:
            return self.profile_rows
        key = (rates, shape)
        found = self._truth.get(key)
        if found is None:
            if len(self._truth) >= TRUTH_CACHE:
                self._truth.clear()
            batch = np.arange(1, self.max_num_seqs + 1)
            found = np.empty_like(self.profile_rows)
            for k in range(self.num_speculative_tokens + 1):
                inputs = self.inputs(np.array(k), batch, rates, shape)
                found[k, 1:] = self.serving.expected_step_seconds(
                    inputs.base_s, inputs.arrivals, inputs.miss_above, shape, inputs.attention_s
                )
            found[:, 0] = found[:, 1]
            found.setflags(write=False)
            self._truth[key] = found
        return found

    def true_step_times(self, rates: tuple[float, ...], shape: TrafficShape | None) -> StepTimes:
        """The true expected T(B, k) in ms for B = 1..max_num_seqs and the profiled k, as the
        solver takes step times (``build_table``, ``evaluate_table``)."""
        ks = self.step_times.ks
        rows = self.true_rows(rates, shape)
        return StepTimes(
            grid=tuple(range(1, self.max_num_seqs + 1)), ks=ks, ms=rows[list(ks), 1:] * 1000.0
        )
