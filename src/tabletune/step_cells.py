"""Step-time cells: the unit in which the plugin counts engine steps and the daemon learns the
step time of the traffic actually served. Pure; shared by the plugin, the emulator and the daemon.

A cell is a draft length k and a batch-size range: batch sizes 1..16 each on their own, then
8-wide ranges 17-24, 25-32, ... They line up with the profiler's grid (dense to 16, then every
8), so the profile's piecewise-linear T is linear inside a cell and T at a cell's mean batch
size is the mean of T over its steps: live and profile compare exactly.

Per cell the plugin keeps five sums over the steps that decode (prefill may ride along): steps,
seconds, seconds squared, scheduled tokens and scheduled requests (the batch size vLLM's
lookup uses). Sums and counts only: cheap on every step, and exact over any window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

EXACT_UP_TO = 16
CELL_WIDTH = 8

Cell = tuple[int, int]  # inclusive batch-size range (low, high)
CellKey = tuple[int, int, int]  # (k, low, high)


def cell_of(batch_size: int) -> Cell:
    """The batch-size range a step of ``batch_size`` requests is counted in."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    if batch_size <= EXACT_UP_TO:
        return (batch_size, batch_size)
    low = EXACT_UP_TO + 1 + (batch_size - EXACT_UP_TO - 1) // CELL_WIDTH * CELL_WIDTH
    return (low, low + CELL_WIDTH - 1)


def cell_label(cell: Cell) -> str:
    """The ``batch`` label value: ``"5"`` or ``"17-24"``."""
    low, high = cell
    return str(low) if low == high else f"{low}-{high}"


def parse_cell_label(label: str) -> Cell:
    """Inverse of ``cell_label``; ValueError for anything that is not a cell's own label."""
    low_text, dash, high_text = label.partition("-")
    if not low_text.isdigit() or (dash and not high_text.isdigit()):
        raise ValueError(f"not a batch cell label: {label!r}")
    low = int(low_text)
    cell = (low, int(high_text) if dash else low)
    if low < 1 or cell_of(low) != cell or cell_label(cell) != label:
        raise ValueError(f"not a batch cell label: {label!r}")
    return cell


def cells_up_to(max_batch: int) -> tuple[Cell, ...]:
    """Every cell that holds a batch size in 1..max_batch, in order."""
    out: list[Cell] = []
    b = 1
    while b <= max_batch:
        cell = cell_of(b)
        out.append(cell)
        b = cell[1] + 1
    return tuple(out)


@dataclass(frozen=True, slots=True)
class CellTotals:
    """Sums over the steps of one cell (totals since start, or increases over a window)."""

    steps: float = 0.0
    seconds: float = 0.0
    seconds_sq: float = 0.0
    tokens: float = 0.0  # scheduled tokens (decode, verified drafts and prefill chunks)
    requests: float = 0.0  # sum of scheduled requests: steps x mean batch size

    def __add__(self, other: CellTotals) -> CellTotals:
        return CellTotals(
            self.steps + other.steps,
            self.seconds + other.seconds,
            self.seconds_sq + other.seconds_sq,
            self.tokens + other.tokens,
            self.requests + other.requests,
        )

    def since(self, earlier: CellTotals) -> CellTotals:
        """The increase from ``earlier`` (totals read before) to these totals."""
        return CellTotals(
            self.steps - earlier.steps,
            self.seconds - earlier.seconds,
            self.seconds_sq - earlier.seconds_sq,
            self.tokens - earlier.tokens,
            self.requests - earlier.requests,
        )

    def scaled(self, factor: float) -> CellTotals:
        return CellTotals(
            self.steps * factor,
            self.seconds * factor,
            self.seconds_sq * factor,
            self.tokens * factor,
            self.requests * factor,
        )

    def went_back_from(self, earlier: CellTotals) -> bool:
        """Any sum below the earlier reading: the counters restarted from zero."""
        return (
            self.steps < earlier.steps
            or self.seconds < earlier.seconds
            or self.seconds_sq < earlier.seconds_sq
            or self.tokens < earlier.tokens
            or self.requests < earlier.requests
        )

    @property
    def mean_s(self) -> float:
        return self.seconds / self.steps if self.steps > 0 else math.nan

    @property
    def mean_batch(self) -> float:
        return self.requests / self.steps if self.steps > 0 else math.nan

    @property
    def mean_tokens(self) -> float:
        return self.tokens / self.steps if self.steps > 0 else math.nan

    @property
    def variance_s2(self) -> float:
        """Variance of one step's duration (population; 0 for fewer than two steps)."""
        if self.steps < 2:
            return 0.0
        mean = self.seconds / self.steps
        return max(0.0, self.seconds_sq / self.steps - mean * mean)


StepCells = Mapping[CellKey, CellTotals]


def cell_key(k: int, batch_size: int) -> CellKey:
    low, high = cell_of(batch_size)
    return (k, low, high)


class StepCellCounter:
    """The engine side's running sums, updated once per step (a few float adds)."""

    __slots__ = ("_sums", "steps_without_decode", "switch_seconds", "switch_steps")

    def __init__(self) -> None:
        self._sums: dict[tuple[int, int], list[float]] = {}  # (k, batch_size) -> 5 sums
        self.steps_without_decode = 0
        self.switch_steps = 0
        self.switch_seconds = 0.0

    def record(self, *, batch_size: int, k: int, duration_s: float, tokens: int) -> None:
        """One step that decoded: ``batch_size`` scheduled requests verifying ``k`` drafts."""
        sums = self._sums.get((k, batch_size))
        if sums is None:
            if batch_size < 1 or k < 0:
                raise ValueError(f"bad step: batch_size={batch_size}, k={k}")
            sums = self._sums[(k, batch_size)] = [0.0, 0.0, 0.0, 0.0, 0.0]
        sums[0] += 1.0
        sums[1] += duration_s
        sums[2] += duration_s * duration_s
        sums[3] += tokens
        sums[4] += batch_size

    def record_without_decode(self) -> None:
        """A step that scheduled only prefill (it has no k and is not in any cell)."""
        self.steps_without_decode += 1

    def record_switch(self, duration_s: float) -> None:
        """The first step at a k other than the previous decoding step's: kept out of the cells,
        whose means are the step time of running at that k, not of changing to it."""
        self.switch_steps += 1
        self.switch_seconds += duration_s

    def totals(self) -> dict[CellKey, CellTotals]:
        out: dict[CellKey, CellTotals] = {}
        for (k, batch_size), sums in self._sums.items():
            key = cell_key(k, batch_size)
            found = out.get(key)
            add = CellTotals(*sums)
            out[key] = add if found is None else found + add
        return out

    def to_wire(self) -> dict[str, Any]:
        """Plain lists and numbers (the engine-core process hands them to the API server)."""
        return cells_to_wire(
            self.totals(),
            self.steps_without_decode,
            switches=(self.switch_steps, self.switch_seconds),
        )


def cells_to_wire(
    cells: StepCells, steps_without_decode: float, *, switches: tuple[float, float] = (0, 0.0)
) -> dict[str, Any]:
    rows = [
        [k, low, high, t.steps, t.seconds, t.seconds_sq, t.tokens, t.requests]
        for (k, low, high), t in sorted(cells.items())
    ]
    return {
        "cells": rows,
        "steps_without_decode": steps_without_decode,
        "switch_steps": switches[0],
        "switch_seconds": switches[1],
    }


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number, got {value!r:.60}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{what} must be finite and >= 0, got {number}")
    return number


def cells_from_wire(data: object) -> tuple[dict[CellKey, CellTotals], float]:
    """Inverse of ``cells_to_wire``; ValueError naming the first problem."""
    if not isinstance(data, dict):
        raise ValueError(f"step cells must be an object, got {type(data).__name__}")
    rows = data.get("cells")
    if not isinstance(rows, list):
        raise ValueError("step cells: 'cells' must be a list")
    out: dict[CellKey, CellTotals] = {}
    for index, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != 8:
            raise ValueError(f"step cells: row #{index} must hold 8 values")
        k, low, high = row[:3]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (k, low, high)):
            raise ValueError(f"step cells: row #{index}: k, low, high must be integers")
        if k < 0 or low < 1 or cell_of(low) != (low, high):
            raise ValueError(f"step cells: row #{index}: ({k}, {low}, {high}) is not a cell")
        values = [_number(v, f"step cells: row #{index}") for v in row[3:]]
        out[(k, low, high)] = CellTotals(*values)
    return out, _number(data.get("steps_without_decode", 0), "steps_without_decode")


def switches_from_wire(data: object) -> tuple[float, float]:
    """(steps, seconds) of the k-switch steps in ``cells_to_wire`` data (0 when absent)."""
    if not isinstance(data, dict):
        raise ValueError(f"step cells must be an object, got {type(data).__name__}")
    return (
        _number(data.get("switch_steps", 0), "switch_steps"),
        _number(data.get("switch_seconds", 0), "switch_seconds"),
    )


def merge_cells(parts: Iterable[StepCells]) -> dict[CellKey, CellTotals]:
    """Sum cells of several engines (data-parallel ranks of one replica)."""
    out: dict[CellKey, CellTotals] = {}
    for part in parts:
        for key, totals in part.items():
            found = out.get(key)
            out[key] = totals if found is None else found + totals
    return out
