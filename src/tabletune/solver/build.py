"""Table build: argmax_k G(B, k) per batch size, sticky against near-ties, compressed to ranges.

Stickiness: keep the previous batch size's k unless another allowed k is more than
``stickiness`` (0.5 %) better; near-ties must not fragment the table into many ranges.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from tabletune.solver.errors import SolverError
from tabletune.solver.model import StepTimes, goodput_matrix

Range = tuple[int, int, int]
DEFAULT_STICKINESS = 0.005


def compress(lookup: Sequence[int]) -> tuple[Range, ...]:
    """Dense per-batch-size k (``lookup[i]`` is k at B=i+1) -> inclusive ranges."""
    ranges: list[Range] = []
    for index, k in enumerate(lookup):
        b = index + 1
        if ranges and ranges[-1][2] == k:
            ranges[-1] = (ranges[-1][0], b, k)
        else:
            ranges.append((b, b, int(k)))
    return tuple(ranges)


def expand(ranges: Sequence[Range], max_batch: int) -> tuple[int, ...]:
    """Ranges -> k for B = 1..max_batch, carrying the last k forward as vLLM does."""
    if not ranges or ranges[0][0] != 1:
        raise SolverError("ranges must start at batch size 1")
    out: list[int] = []
    current = ranges[0][2]
    position = 0
    for b in range(1, max_batch + 1):
        while position < len(ranges) and ranges[position][0] <= b:
            current = ranges[position][2]
            position += 1
        out.append(current)
    return tuple(out)


@dataclass(frozen=True)
class Solution:
    """A built table with what it was built from, able to check itself."""

    ranges: tuple[Range, ...]
    per_batch_k: tuple[int, ...]
    best_k: tuple[int, ...]
    goodput: tuple[float, ...]
    best_goodput: tuple[float, ...]
    allowed_k: frozenset[int]
    stickiness: float

    @property
    def max_batch(self) -> int:
        return len(self.per_batch_k)

    def check(self) -> None:
        """Raise SolverError unless the table covers 1..max_B exactly, uses only allowed k,
        and is within ``stickiness`` of the best allowed k at every batch size."""
        expected_start = 1
        for start, end, k in self.ranges:
            if start != expected_start or end < start:
                raise SolverError(f"range ({start}, {end}, {k}) leaves a gap or overlaps")
            if k not in self.allowed_k:
                raise SolverError(f"range ({start}, {end}, {k}) uses a disallowed k")
            expected_start = end + 1
        if expected_start != self.max_batch + 1:
            raise SolverError(f"ranges end at {expected_start - 1}, not at {self.max_batch}")
        if expand(self.ranges, self.max_batch) != self.per_batch_k:
            raise SolverError("ranges do not reproduce the per-batch choice")
        for index, (got, best) in enumerate(zip(self.goodput, self.best_goodput, strict=True)):
            if got * (1.0 + self.stickiness) < best * (1.0 - 1e-12):
                raise SolverError(
                    f"B={index + 1}: chosen goodput {got:.6g} is more than "
                    f"{self.stickiness:.1%} below the best {best:.6g}"
                )


def build_table(
    step_times: StepTimes,
    rates: Sequence[float],
    *,
    allowed_k: Iterable[int] | None = None,
    max_batch: int | None = None,
    stickiness: float = DEFAULT_STICKINESS,
) -> Solution:
    """The goodput-maximising table for acceptance ``rates`` over B = 1..max_batch."""
    if stickiness < 0:
        raise SolverError("stickiness must be >= 0")
    max_batch = step_times.max_batch if max_batch is None else max_batch
    allowed = frozenset(step_times.ks if allowed_k is None else allowed_k)
    unknown = sorted(allowed - set(step_times.ks))
    if unknown:
        raise SolverError(f"allowed k {unknown} were not profiled (profiled: {step_times.ks})")
    if not allowed:
        raise SolverError("the allowed set of k is empty")
    g = goodput_matrix(step_times, rates, max_batch)
    rows = [i for i, k in enumerate(step_times.ks) if k in allowed]
    sub = g[rows]
    ks = [step_times.ks[i] for i in rows]
    best_index = np.argmax(sub, axis=0)  # first (smallest k) wins exact ties
    best_g = sub[best_index, np.arange(max_batch)]
    choice = np.empty(max_batch, dtype=int)
    previous = int(best_index[0])
    for col in range(max_batch):
        best = int(best_index[col])
        if col > 0 and best_g[col] <= sub[previous, col] * (1.0 + stickiness):
            best = previous
        choice[col] = best
        previous = best
    per_batch = tuple(ks[i] for i in choice)
    solution = Solution(
        ranges=compress(per_batch),
        per_batch_k=per_batch,
        best_k=tuple(ks[int(i)] for i in best_index),
        goodput=tuple(float(sub[choice[c], c]) for c in range(max_batch)),
        best_goodput=tuple(float(v) for v in best_g),
        allowed_k=allowed,
        stickiness=stickiness,
    )
    solution.check()
    return solution
