"""One table build's inputs, validated on construction, with a stable fingerprint.

A ``TableProblem`` that exists is one ``solve`` can work with: every input error surfaces here
as one ``SolverError`` naming the input. Two problems with the same inputs compare equal and
hash alike (by content, not identity), so a caller can memoise solutions by problem.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from tabletune.solver.errors import SolverError
from tabletune.solver.model import StepTimes, check_rates

DEFAULT_STICKINESS = 0.005
DEFAULT_CONFIDENCE = 1.0


@dataclass(frozen=True, kw_only=True, eq=False)
class TableProblem:
    """What a table is built from; ``solve(problem)`` builds it."""

    step_times: StepTimes
    """T(B, k) in ms; the daemon passes a dense grid 1..max_batch, a profile its own grid"""
    rates: Sequence[float]
    """a_1..a_K (stored as a tuple); must cover the longest profiled k"""
    allowed_k: Collection[int]
    """the draft lengths the engine may run (stored as a frozenset), all profiled"""
    max_batch: int
    """the table covers B = 1..max_batch, within the profiled grid"""
    stickiness: float = DEFAULT_STICKINESS
    """keep the reference k unless another is better by more than this fraction"""
    uncertainty: np.ndarray | None = None
    """relative sigma_T / T per (k, B), shape (len(ks), max_batch) like the dense T; None: exact"""
    confidence: float = DEFAULT_CONFIDENCE
    """z: a gain counts only when larger than z * sigma of the difference (0: ignore sigma)"""
    baseline: Sequence[int] | None = None
    """k per B = 1..max_batch of the running table (stored as a tuple): kept unless clearly
    beaten; a baseline k that is not allowed is no reference (the sticky chain applies)"""
    min_width: int = 1
    """no range narrower than this many batch sizes, unless the table is one range"""

    def __post_init__(self) -> None:
        st = self.step_times
        rates = check_rates(self.rates)
        if st.ks[-1] > len(rates):
            raise SolverError(
                f"acceptance known up to K={len(rates)} but k={st.ks[-1]} was profiled"
            )
        allowed = frozenset(int(k) for k in self.allowed_k)
        if not allowed:
            raise SolverError("the allowed set of k is empty")
        unknown = sorted(allowed - set(st.ks))
        if unknown:
            raise SolverError(f"allowed k {unknown} were not profiled (profiled: {list(st.ks)})")
        if not 1 <= self.max_batch <= st.max_batch:
            raise SolverError(
                f"max_batch={self.max_batch} is outside the profiled 1..{st.max_batch}"
            )
        for name in ("stickiness", "confidence"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise SolverError(f"{name} must be a finite number >= 0, got {value}")
        if isinstance(self.min_width, bool) or not isinstance(self.min_width, int):
            raise SolverError(f"min_width must be an integer >= 1, got {self.min_width!r}")
        if self.min_width < 1:
            raise SolverError(f"min_width must be an integer >= 1, got {self.min_width}")
        object.__setattr__(self, "rates", rates)
        object.__setattr__(self, "allowed_k", allowed)
        object.__setattr__(self, "uncertainty", self._checked_uncertainty())
        object.__setattr__(self, "baseline", self._checked_baseline())

    def _checked_uncertainty(self) -> np.ndarray | None:
        if self.uncertainty is None:
            return None
        sigma = np.array(self.uncertainty, dtype=float)  # a copy: the caller's stays theirs
        shape = (len(self.step_times.ks), self.max_batch)
        if sigma.shape != shape:
            raise SolverError(f"uncertainty shape {sigma.shape} != (len(ks), max_batch) = {shape}")
        if not np.all(np.isfinite(sigma)) or np.any(sigma < 0):
            raise SolverError("uncertainty must be finite and >= 0 everywhere")
        sigma.setflags(write=False)
        return sigma

    def _checked_baseline(self) -> tuple[int, ...] | None:
        if self.baseline is None:
            return None
        baseline = np.asarray(self.baseline, dtype=int)
        if baseline.shape != (self.max_batch,):
            raise SolverError(
                f"baseline has {baseline.size} entries, expected one per B = 1..{self.max_batch}"
            )
        negative = np.flatnonzero(baseline < 0)
        if negative.size:
            b = int(negative[0]) + 1
            raise SolverError(f"baseline k at B={b} is {baseline[b - 1]}, must be >= 0")
        return tuple(baseline.tolist())

    @cached_property
    def fingerprint(self) -> str:
        """A hex digest of every input: equal inputs, equal fingerprint (a memo key)."""
        st = self.step_times
        digest = hashlib.sha256()  # not for security: the fastest stable digest of the lot
        scalars = (
            st.grid,
            st.ks,
            self.rates,
            sorted(self.allowed_k),
            self.max_batch,
            self.stickiness,
            self.confidence,
            self.min_width,
            self.uncertainty is None,
            self.baseline is None,
        )
        digest.update(repr(scalars).encode())
        digest.update(np.ascontiguousarray(st.ms, dtype=float).tobytes())
        for array in (self.uncertainty, self.baseline):
            if array is not None:
                digest.update(np.ascontiguousarray(array, dtype=float).tobytes())
        return digest.hexdigest()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TableProblem):
            return NotImplemented
        return self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)
