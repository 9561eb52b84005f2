"""Random draws used up in order, a fixed number per step (or per arriving request): what a step
draws does not depend on how steps were grouped into batches, so a batched run, a step-by-step
run and a run cut by scrapes at any times all give the same steps."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable

import numpy as np

from tabletune.sim.serving import TrafficShape, arrival_tokens, chunked_prefill

Draw = Callable[[np.random.Generator, int], np.ndarray]
BLOCK = 4096


def uniforms(rng: np.random.Generator, count: int) -> np.ndarray:
    return rng.random(count)


class DrawStream:
    """Draws from one generator, looked at ahead (``peek``) and used up in order (``use``)."""

    def __init__(self, rng: np.random.Generator, draw: Draw) -> None:
        self._rng = rng
        self._draw = draw
        self._buffer = np.ones(0)
        self._at = 0

    def peek(self, count: int) -> np.ndarray:
        """The next ``count`` draws, without using them up."""
        available = self._buffer.size - self._at
        if available < count:
            fresh = self._draw(self._rng, max(BLOCK, count - available))
            self._buffer = np.concatenate((self._buffer[self._at :], fresh))
            self._at = 0
        return self._buffer[self._at : self._at + count]

    def use(self, count: int) -> None:
        self._at += count


class PrefillStream:
    """Closed-loop prefill per step: Poisson arrivals, their prompt lengths, the backlog of
    prompt tokens that did not fit a step's budget (served first in the next steps)."""

    def __init__(self, arrivals_rng: np.random.Generator, prompts_rng: np.random.Generator) -> None:
        self.arrivals = DrawStream(arrivals_rng, uniforms)  # one per step
        self.prompts = DrawStream(prompts_rng, uniforms)  # one per arriving request
        self.backlog = 0

    def ahead(
        self, steps: int, arrival_cdf: np.ndarray, shape: TrafficShape, budget: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For the next ``steps`` steps at one (B, k) (arrivals per step ~ ``arrival_cdf``):
        prefill tokens served, arrivals, and the backlog after each step; nothing used up
        (``use`` what ran)."""
        counts = np.searchsorted(arrival_cdf, self.arrivals.peek(steps), side="right")
        prompts = shape.prompt.sample(self.prompts.peek(int(counts.sum())))
        served, backlog = chunked_prefill(arrival_tokens(counts, prompts), budget, self.backlog)
        return served, counts, backlog

    def use(self, steps: int, counts: np.ndarray, backlog: np.ndarray) -> None:
        """The first ``steps`` of what ``ahead`` returned ran."""
        self.arrivals.use(steps)
        self.prompts.use(int(counts[:steps].sum()))
        self.backlog = int(backlog[steps - 1])

    def cursor(self, shape: TrafficShape) -> PrefillCursor:
        return PrefillCursor(self, shape)


class PrefillCursor:
    """The same draws one step at a time, for policies whose k changes from step to step."""

    def __init__(self, stream: PrefillStream, shape: TrafficShape) -> None:
        self._stream = stream
        self._shape = shape
        self._uniforms: list[float] = []
        self._prompt_sums: list[int] = [0]
        self.steps = 0
        self.prompts = 0
        self.backlog = stream.backlog

    def next(self, arrival_cdf: list[float], budget: int) -> int:
        """Prefill tokens served in the next step (runs once per step: kept lean)."""
        steps, start = self.steps, self.prompts
        if steps >= len(self._uniforms):
            self._uniforms = self._stream.arrivals.peek(2 * steps + 64).tolist()
        end = start + bisect_right(arrival_cdf, self._uniforms[steps])
        sums = self._prompt_sums
        if end >= len(sums):
            lengths = self._shape.prompt.sample(self._stream.prompts.peek(2 * end + 64))
            sums = self._prompt_sums = [0, *np.cumsum(lengths, dtype=np.int64).tolist()]
        self.steps, self.prompts = steps + 1, end
        pending = self.backlog + sums[end] - sums[start]
        if pending > budget:
            self.backlog = pending - budget
            return budget
        self.backlog = 0
        return pending

    def commit(self) -> None:
        """Use up what the steps taken drew."""
        self._stream.arrivals.use(self.steps)
        self._stream.prompts.use(self.prompts)
        self._stream.backlog = self.backlog
