"""Pure timing arithmetic: the batch grid, step time from two request durations, the cell
statistic, and which cells disagree with their neighbours (re-measure them; never smooth)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tabletune.errors import InputError
from tabletune.profiler.errors import MeasurementError
from tabletune.schemas.profile import Cell

CellKey = tuple[int, int]  # (batch_size, k)


@dataclass(frozen=True)
class CellDetails:
    """What a cell's steps carried (the profile's optional per-cell fields)."""

    context_tokens: float | None = None
    tokens_per_step: float | None = None


def batch_grid(max_num_seqs: int, *, dense_until: int = 16, step: int = 8) -> tuple[int, ...]:
    """1..dense_until, then every ``step`` up to max_num_seqs; max_num_seqs is always included."""
    if max_num_seqs < 1:
        raise InputError("max_num_seqs must be >= 1")
    if dense_until < 1 or step < 1:
        raise InputError("grid: dense_until and step must be >= 1")
    grid = list(range(1, min(dense_until, max_num_seqs) + 1))
    b = dense_until + step
    while b < max_num_seqs:
        grid.append(b)
        b += step
    if grid[-1] != max_num_seqs:
        grid.append(max_num_seqs)
    return tuple(grid)


def explicit_grid(batch_sizes: Sequence[int], max_num_seqs: int) -> tuple[int, ...]:
    """A given grid, sorted and checked against max_num_seqs."""
    grid = tuple(sorted(set(batch_sizes)))
    if not grid or grid[0] < 1 or grid[-1] > max_num_seqs:
        raise InputError(f"batch sizes must be within 1..max_num_seqs={max_num_seqs}: {grid}")
    return grid


def step_ms(short_s: float, long_s: float, decode_tokens: int) -> float:
    """One decode step in ms from a 1-token and a (1 + decode_tokens)-token request of the same
    batch: both pay the same prefill and overheads, the long one ``decode_tokens`` more steps."""
    if decode_tokens < 1:
        raise ValueError("decode_tokens must be >= 1")
    return (long_s - short_s) * 1000.0 / decode_tokens


def median(samples: Sequence[float]) -> float:
    return float(statistics.median(samples))


def suspicious_cells(
    samples: Mapping[CellKey, Sequence[float]],
    grid: Sequence[int],
    *,
    factor: float,
) -> list[CellKey]:
    """Cells to re-measure, in (k, B) order: a non-positive sample, or a median that stands
    out by more than ``factor`` from every neighbour, in the same direction (a lone spike or
    dip). Neighbours are the grid cells either side (same k); at an end of the grid, the two on
    the one side. A step that stays up (a real regime change) agrees with one neighbour and is
    left alone; so is a steady rise."""
    out: list[CellKey] = []
    for k in sorted({k for _, k in samples}):
        row = [(b, median(samples[(b, k)])) for b in grid if (b, k) in samples]
        for index, (b, value) in enumerate(row):
            if min(samples[(b, k)]) <= 0:
                out.append((b, k))
                continue
            near = [j for j in (index - 1, index + 1) if 0 <= j < len(row)]
            if len(near) == 1:
                beyond = 2 * near[0] - index
                near += [beyond] if 0 <= beyond < len(row) else []
            ratios = [value / row[j][1] for j in near if row[j][1] > 0]
            if ratios and (
                all(r > factor for r in ratios) or all(r < 1.0 / factor for r in ratios)
            ):
                out.append((b, k))
    return out


def build_cells(
    samples: Mapping[CellKey, Sequence[float]],
    noisy: set[CellKey],
    details: Mapping[CellKey, CellDetails] | None = None,
) -> tuple[Cell, ...]:
    """Cells with every raw sample and their median; ``noisy`` cells keep their measured median.

    A non-positive sample cannot be a step time (the clock or the server misbehaved): that is
    an error to report, not a value to keep.
    """
    cells = []
    for (b, k), values in sorted(samples.items(), key=lambda item: (item[0][1], item[0][0])):
        value = median(values)
        if value <= 0 or min(values) <= 0:
            raise MeasurementError(
                f"B={b} k={k}: non-positive step time in samples {list(values)} "
                "(the long request did not take longer than the short one)"
            )
        extra = (details or {}).get((b, k), CellDetails())
        cells.append(
            Cell(
                batch_size=b,
                k=k,
                samples_ms=tuple(values),
                step_ms=value,
                noisy=(b, k) in noisy,
                context_tokens=extra.context_tokens,
                tokens_per_step=extra.tokens_per_step,
            )
        )
    return tuple(cells)
