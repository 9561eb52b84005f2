"""Ranges <-> per-batch-size k, in one place for every part of TableTune.

Two indexings exist and both are built here from the same expansion:
- ``expand``: k for B = 1..max_batch as a 0-based tuple (``per_batch[b - 1]``), the solver's;
- ``dense_lookup``: vLLM's ``build_dynamic_sd_schedule_lookup`` (``lookup[b]``, index 0 unused,
  every k capped at the drafter's K), the engine's.
Gaps between ranges and the tail after the last one carry the previous k forward, as vLLM does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tabletune.solver.errors import SolverError

Range = tuple[int, int, int]
"""An inclusive ``(start, end, k)`` batch-size range, vLLM's form."""


def compress(per_batch: Sequence[int] | np.ndarray) -> tuple[Range, ...]:
    """Per-batch-size k (``per_batch[i]`` is k at B=i+1) -> the fewest inclusive ranges."""
    values = np.asarray(per_batch, dtype=int)
    if values.size == 0:
        return ()
    changes = (np.flatnonzero(values[1:] != values[:-1]) + 1).tolist()
    starts = [0, *changes]
    ends = [*changes, int(values.size)]
    ks = values[starts].tolist()
    return tuple((start + 1, end, k) for start, end, k in zip(starts, ends, ks, strict=True))


def expand(ranges: Sequence[Range], max_batch: int) -> tuple[int, ...]:
    """Sorted, non-overlapping ranges starting at 1 -> k for B = 1..max_batch."""
    if max_batch < 1:
        raise SolverError(f"max_batch must be >= 1, got {max_batch}")
    if not ranges or ranges[0][0] != 1:
        raise SolverError("ranges must start at batch size 1")
    out: list[int] = []
    previous_end = 0
    for start, end, k in ranges:
        if start <= previous_end or end < start:
            raise SolverError(f"range ({start}, {end}, {k}) overlaps or runs backwards")
        if start > max_batch:
            break
        _carry_to(out, start - 1)
        out.extend([k] * (min(end, max_batch) - start + 1))
        previous_end = end
    _carry_to(out, max_batch)
    return tuple(out)


def _carry_to(per_batch: list[int], size: int) -> None:
    """Fill a gap (or the tail) up to ``size`` entries with the last k, as vLLM does."""
    if len(per_batch) < size:
        per_batch.extend([per_batch[-1]] * (size - len(per_batch)))


def dense_lookup(ranges: Sequence[Range], max_batch: int, max_k: int) -> list[int]:
    """vLLM's dense lookup: ``lookup[b]`` is k at batch size b (index 0 unused), capped at K."""
    if max_k <= 0:
        raise SolverError(f"max_k must be > 0, got {max_k}")
    per_batch = expand(ranges, max_batch)
    if max(per_batch) <= max_k:  # the usual case: nothing to cap
        return [0, *per_batch]
    return [0, *(min(k, max_k) for k in per_batch)]


def ranges_from_lookup(lookup: Sequence[int]) -> tuple[Range, ...]:
    """A dense lookup (index 0 unused) back into ranges."""
    return compress(lookup[1:])
