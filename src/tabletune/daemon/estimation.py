"""Per-unit (replica or pool) acceptance tracking around the solver's estimator.

Live counts accumulate until ``rebuild_every_drafts`` new drafts have been seen; then the
estimate is rebuilt (``rebuild_step``: a_hat, then live counts halved, w halved with prior decay).
Between rebuilds the last estimate stands, so decisions never rest on a handful of drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tabletune.daemon.settings import EstimatorSettings
from tabletune.solver import EstimatorState, observe, rebuild_step


def fit_positions(counts: Sequence[float], size: int) -> tuple[float, ...]:
    """Counts per position padded with zeros / cut to the prior's K positions."""
    values = [float(c) for c in counts[:size]]
    return tuple(values + [0.0] * (size - len(values)))


@dataclass
class UnitEstimator:
    """Estimator state of one unit, with the last rebuilt rates."""

    state: EstimatorState
    rates: tuple[float, ...]
    drafts_since_rebuild: float = 0.0
    rebuilds: int = 0

    @classmethod
    def start(cls, prior: Sequence[float], *, settings: EstimatorSettings) -> UnitEstimator:
        state = EstimatorState.start(prior, settings.prior_weight)
        return cls(state=state, rates=state.prior)

    def add(
        self,
        drafted: Sequence[float],
        accepted: Sequence[float],
        *,
        settings: EstimatorSettings,
    ) -> bool:
        """Add live counts; True when this triggered a rebuild (new ``rates``)."""
        size = len(self.state.prior)
        d = fit_positions(drafted, size)
        # Counters are read a moment apart: never let accepted exceed drafted at a position.
        a = tuple(min(x, y) for x, y in zip(fit_positions(accepted, size), d, strict=True))
        self.state = observe(self.state, d, a)
        self.drafts_since_rebuild += d[0] if d else 0.0
        if self.drafts_since_rebuild < settings.rebuild_every_drafts:
            return False
        self.rates, self.state = rebuild_step(self.state, prior_decay=settings.prior_decay)
        self.drafts_since_rebuild = 0.0
        self.rebuilds += 1
        return True
