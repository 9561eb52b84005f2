"""A built table with what it was built from, per batch size and per range, able to check itself.

Goodput is in tokens/ms; every sigma is absolute (tokens/ms), from sigma_G / G = sigma_T / T.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
        chosen, rule = np.asarray(self.per_batch_k), np.asarray(self.rule_k)
        runs = compress(self.rule_k)
        widths = np.array([end - start + 1 for start, end, _ in runs])
        in_narrow_run = np.repeat(widths < self.min_width, widths)
        unexplained = np.flatnonzero((chosen != rule) & ~in_narrow_run)
        if unexplained.size:
            b = int(unexplained[0]) + 1
            raise SolverError(
                f"B={b}: k={chosen[b - 1]} replaces the rule's k={rule[b - 1]} though its run "
                f"is not narrower than min_width={self.min_width}"
            )
        got, best = np.asarray(self.goodput), np.asarray(self.best_goodput)
        noise = self.confidence * np.hypot(self.goodput_sigma, self.best_goodput_sigma)
        near = got * (1.0 + self.stickiness) >= best * (1.0 - _SLACK)
        inside_noise = best - got <= noise + _SLACK * best
        too_far = np.flatnonzero((chosen == rule) & ~near & ~inside_noise)
        if too_far.size:
            i = int(too_far[0])
            raise SolverError(
                f"B={i + 1}: chosen goodput {got[i]:.6g} is more than {self.stickiness:.1%} and "
                f"{self.confidence:g} sigma ({noise[i]:.3g}) below the best {best[i]:.6g}"
            )
