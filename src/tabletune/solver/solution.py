"""A built table with what it was built from, per batch size and per range, able to check itself.

Goodput is in tokens/ms; every sigma is absolute (tokens/ms), from sigma_G / G = sigma_T / T.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tabletune.solver.errors import SolverError
from tabletune.solver.ranges import Range, compress, expand

# Float slack for comparisons against values the solver itself computed.
_SLACK = 1e-12


@dataclass(frozen=True)
class RangeSummary:
    """One range of the table, for the readable view and for the lead's logs."""

    start: int
    end: int
    k: int
    goodput: float
    """mean predicted goodput over the range"""
    goodput_sigma: float
    """its sigma: the per-B sigmas averaged (neighbouring B share cells, so they move together)"""
    alternative_k: int | None
    """the best other allowed k over the range (by mean goodput); None when k is the only one"""
    alternative_margin: float | None
    """goodput / the alternative's mean goodput - 1 (negative: the alternative predicts more)"""
    absorbed: tuple[Range, ...]
    """runs of the per-B rule's choice that a min-width merge relabelled to this k"""
    why: str
    """in words: at how many B k is the best, kept near the best, or came from a merge"""

    @property
    def width(self) -> int:
        return self.end - self.start + 1


@dataclass(frozen=True)
class Solution:
    """The table, per-B choice and goodput, and the settings it was built under."""

    ranges: tuple[Range, ...]
    per_batch_k: tuple[int, ...]
    """the table's k at B = 1..max_batch (after min-width merges)"""
    best_k: tuple[int, ...]
    goodput: tuple[float, ...]
    best_goodput: tuple[float, ...]
    allowed_k: frozenset[int]
    stickiness: float
    goodput_sigma: tuple[float, ...]
    """sigma of ``goodput`` per B (0 without uncertainty)"""
    best_goodput_sigma: tuple[float, ...]
    rule_k: tuple[int, ...]
    """the noise-aware per-B choice before min-width merges"""
    confidence: float
    min_width: int
    summaries: tuple[RangeSummary, ...]

    @property
    def max_batch(self) -> int:
        return len(self.per_batch_k)

    def check(self) -> None:
        """Raise SolverError unless the table covers 1..max_B exactly with allowed k, holds the
        min width, and every B runs a k within the noise-aware tolerance of the best one or
        was relabelled by a min-width merge of a run narrower than the min width."""
        self._check_cover()
        if expand(self.ranges, self.max_batch) != self.per_batch_k:
            raise SolverError("ranges do not reproduce the per-batch choice")
        if len(self.ranges) > 1:
            for start, end, k in self.ranges:
                if end - start + 1 < self.min_width:
                    raise SolverError(
                        f"range ({start}, {end}, {k}) is narrower than min_width={self.min_width}"
                    )
        self._check_choices()
        if tuple((s.start, s.end, s.k) for s in self.summaries) != self.ranges:
            raise SolverError("the range summaries do not match the ranges")

    def _check_cover(self) -> None:
        expected_start = 1
        for start, end, k in self.ranges:
            if start != expected_start or end < start:
                raise SolverError(f"range ({start}, {end}, {k}) leaves a gap or overlaps")
            if k not in self.allowed_k:
                raise SolverError(f"range ({start}, {end}, {k}) uses a disallowed k")
            expected_start = end + 1
        if expected_start != self.max_batch + 1:
            raise SolverError(f"ranges end at {expected_start - 1}, not at {self.max_batch}")

    def _check_choices(self) -> None:
        merged = self._narrow_rule_runs()
        for index, (chosen, rule) in enumerate(zip(self.per_batch_k, self.rule_k, strict=True)):
            b = index + 1
            if chosen != rule:
                if b not in merged:
                    raise SolverError(
                        f"B={b}: k={chosen} replaces the rule's k={rule} though its run is not "
                        f"narrower than min_width={self.min_width}"
                    )
                continue
            got, best = self.goodput[index], self.best_goodput[index]
            if got * (1.0 + self.stickiness) >= best * (1.0 - _SLACK):
                continue
            noise = self.confidence * math.hypot(
                self.goodput_sigma[index], self.best_goodput_sigma[index]
            )
            if best - got <= noise + _SLACK * best:
                continue
            raise SolverError(
                f"B={b}: chosen goodput {got:.6g} is more than {self.stickiness:.1%} and "
                f"{self.confidence:g} sigma ({noise:.3g}) below the best {best:.6g}"
            )

    def _narrow_rule_runs(self) -> set[int]:
        """Batch sizes in runs of the rule's choice that a min-width merge may relabel."""
        return {
            b
            for start, end, _ in compress(self.rule_k)
            if end - start + 1 < self.min_width
            for b in range(start, end + 1)
        }
