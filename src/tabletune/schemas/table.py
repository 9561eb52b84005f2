"""The batch-size -> draft-length table, validated exactly as vLLM 0.26 validates
``num_speculative_tokens_per_batch_size`` (plus k <= K when K is known).

One implementation shared by the plugin, the emulator, the daemon and the CLI. ``Range`` and
the conversions between ranges and per-batch k are the solver's (``tabletune.solver.ranges``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from tabletune.solver import SolverError
from tabletune.solver import ranges as solver_ranges
from tabletune.solver.ranges import Range, ranges_from_lookup

__all__ = [
    "DOCUMENTED_EAGLE_TABLE",
    "Range",
    "Table",
    "TableError",
    "dense_lookup",
    "normalize_ranges",
    "ranges_from_lookup",
]

# vLLM's documented EAGLE example table; `compare --table docs` names it.
DOCUMENTED_EAGLE_TABLE: tuple[Range, ...] = ((1, 64, 3), (65, 128, 1), (129, 512, 0))


class TableError(ValueError):
    """A table that vLLM would refuse (or that exceeds K); the message says why."""


def _as_int(value: object, what: str) -> int:
    # vLLM does int(x); we are stricter and refuse bools, floats with fractions and strings,
    # because a JSON "3" or 2.5 in a table is a mistake, not an intent.
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise TableError(f"{what} must be an integer, got {value!r}")
    return value


def normalize_ranges(raw: object, *, max_k: int | None = None) -> tuple[Range, ...]:
    """Validate ``raw`` as vLLM 0.26 does and return sorted ``(start, end, k)`` ranges.

    Rules (vLLM's ``validate_and_normalize_dynamic_sd_schedule``): a non-empty list of 3-item
    entries; positive bounds; start <= end; k >= 0; after sorting by start, non-overlapping;
    the first range starts at 1. Gaps after the first range are allowed (vLLM carries the
    previous k forward). Additionally k <= max_k when given.
    """
    if not isinstance(raw, list | tuple):
        raise TableError("table must be a non-empty list of [start, end, k] ranges")
    if not raw:
        raise TableError("table must not be empty")
    parsed: list[Range] = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, list | tuple) or len(entry) != 3:
            raise TableError(f"range #{index} must be a 3-item [start, end, k], got {entry!r}")
        start = _as_int(entry[0], f"range #{index} start")
        end = _as_int(entry[1], f"range #{index} end")
        k = _as_int(entry[2], f"range #{index} k")
        if start <= 0 or end <= 0:
            raise TableError(f"range #{index} bounds ({start}, {end}) must be positive")
        if start > end:
            raise TableError(f"range #{index} start {start} is after its end {end}")
        if k < 0:
            raise TableError(f"range #{index} k={k} must be >= 0")
        if max_k is not None and k > max_k:
            raise TableError(f"range #{index} k={k} exceeds the drafter's K={max_k}")
        parsed.append((start, end, k))
    parsed.sort(key=lambda r: r[0])
    previous_end = 0
    for start, end, _ in parsed:
        if start <= previous_end:
            raise TableError(f"ranges overlap at batch size {start}")
        previous_end = end
    if parsed[0][0] != 1:
        raise TableError(
            f"the first range must start at 1 (it starts at {parsed[0][0]}), "
            "so every batch size has a defined k"
        )
    return tuple(parsed)


def dense_lookup(ranges: Sequence[Range], max_batch: int, max_k: int) -> list[int]:
    """vLLM's dense lookup (index = batch size, index 0 unused, every k capped at ``max_k``;
    gaps and the tail carry the previous k forward): the solver's one conversion, with the
    schema's error type."""
    try:
        return solver_ranges.dense_lookup(ranges, max_batch, max_k)
    except SolverError as error:
        raise TableError(str(error)) from None


class Table(BaseModel):
    """A validated table: sorted inclusive ``(start, end, k)`` ranges starting at 1."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ranges: tuple[Range, ...]

    @field_validator("ranges", mode="before")
    @classmethod
    def _validate(cls, value: object) -> tuple[Range, ...]:
        return normalize_ranges(value)

    @classmethod
    def parse(cls, raw: object, *, max_k: int | None = None) -> Table:
        """Validate vLLM's JSON form (a list of [start, end, k]); raises TableError."""
        return cls.model_construct(ranges=normalize_ranges(raw, max_k=max_k))

    @classmethod
    def parse_text(cls, text: str, *, max_k: int | None = None) -> Table:
        """Parse inline JSON (``[[1,64,3],...]``), ``{"ranges": ...}`` or the name ``docs``."""
        if text.strip() == "docs":
            return cls.parse([list(r) for r in DOCUMENTED_EAGLE_TABLE], max_k=max_k)
        try:
            data: Any = json.loads(text)
        except json.JSONDecodeError as error:
            raise TableError(f"not valid JSON: {error.msg} at line {error.lineno}") from error
        if isinstance(data, dict):
            for key in ("ranges", "table", "num_speculative_tokens_per_batch_size"):
                if key in data:
                    data = data[key]
                    break
            else:
                raise TableError(
                    "JSON object must hold 'ranges', 'table' or "
                    "'num_speculative_tokens_per_batch_size'"
                )
        return cls.parse(data, max_k=max_k)

    @property
    def ks(self) -> frozenset[int]:
        return frozenset(k for _, _, k in self.ranges)

    @property
    def max_k(self) -> int:
        return max(k for _, _, k in self.ranges)

    def k_at(self, batch_size: int) -> int:
        """k for one batch size, as vLLM's lookup gives it (gaps/tail carry forward)."""
        if batch_size <= 0:
            raise TableError("batch size must be positive")
        return solver_ranges.expand(self.ranges, batch_size)[-1]

    def lookup(self, max_batch: int, max_k: int) -> list[int]:
        return dense_lookup(self.ranges, max_batch, max_k)

    def to_vllm(self) -> list[list[int]]:
        """vLLM's JSON form, ready for ``num_speculative_tokens_per_batch_size``."""
        return [list(r) for r in self.ranges]

    def to_json(self) -> str:
        return json.dumps(self.to_vllm(), separators=(",", ":"))

    def edges(self) -> tuple[int, ...]:
        """Batch sizes where a new range starts (after the first)."""
        return tuple(start for start, _, _ in self.ranges[1:])

    def __str__(self) -> str:
        return self.to_json()
