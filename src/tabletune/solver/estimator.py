"""Online acceptance estimate: a prior blended with live counts that decay.

    a_hat_i = (w * a_prior_i + accepted_i) / (w + drafted_i)

After each rebuild the live counts are halved (recent traffic dominates) and, optionally, w is
halved too (prior decay), so old evidence fades and the estimate keeps tracking traffic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from tabletune.solver.errors import SolverError
from tabletune.solver.model import check_rates

DEFAULT_PRIOR_WEIGHT = 2000.0


@dataclass(frozen=True)
class EstimatorState:
    """Prior a_i with its weight w, and the live per-position drafted/accepted counts."""

    prior: tuple[float, ...]
    weight: float = DEFAULT_PRIOR_WEIGHT
    drafted: tuple[float, ...] = ()
    accepted: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        check_rates(self.prior)
        size = len(self.prior)
        if size == 0:
            raise SolverError("the prior needs at least one rate")
        if self.weight < 0:
            raise SolverError("the prior weight must be >= 0")
        if not self.drafted:
            object.__setattr__(self, "drafted", (0.0,) * size)
        if not self.accepted:
            object.__setattr__(self, "accepted", (0.0,) * size)
        if len(self.drafted) != size or len(self.accepted) != size:
            raise SolverError("drafted/accepted need one count per position")
        for i, (d, a) in enumerate(zip(self.drafted, self.accepted, strict=True), start=1):
            if d < 0 or a < 0:
                raise SolverError(f"position {i}: counts must be >= 0")
            if a > d:
                raise SolverError(f"position {i}: accepted {a} > drafted {d}")

    @classmethod
    def start(cls, prior: Sequence[float], weight: float = DEFAULT_PRIOR_WEIGHT) -> EstimatorState:
        return cls(prior=tuple(float(a) for a in prior), weight=float(weight))


def observe(
    state: EstimatorState, drafted: Sequence[float], accepted: Sequence[float]
) -> EstimatorState:
    """Add live counts: a request that drafts 3 and keeps 2 adds 1 to drafted at positions
    1..3 and 1 to accepted at positions 1..2."""
    if len(drafted) != len(state.prior) or len(accepted) != len(state.prior):
        raise SolverError(f"expected {len(state.prior)} positions of drafted and accepted")
    return replace(
        state,
        drafted=tuple(x + float(y) for x, y in zip(state.drafted, drafted, strict=True)),
        accepted=tuple(x + float(y) for x, y in zip(state.accepted, accepted, strict=True)),
    )


def estimate(state: EstimatorState) -> tuple[float, ...]:
    """a_hat_i; positions with neither prior weight nor live drafts fall back to the prior.

    The running minimum keeps a_hat non-increasing: the first i guesses cannot all be accepted
    more often than the first i-1 are.
    """
    rates: list[float] = []
    for prior, drafted, accepted in zip(state.prior, state.drafted, state.accepted, strict=True):
        denominator = state.weight + drafted
        value = prior if denominator == 0 else (state.weight * prior + accepted) / denominator
        value = min(1.0, max(0.0, value))
        if rates:
            value = min(value, rates[-1])
        rates.append(value)
    return tuple(rates)


def rebuild_step(
    state: EstimatorState, *, prior_decay: bool = False
) -> tuple[tuple[float, ...], EstimatorState]:
    """One rebuild: the estimate, then the state with live counts halved (and w halved when
    ``prior_decay``)."""
    rates = estimate(state)
    decayed = replace(
        state,
        drafted=tuple(d / 2.0 for d in state.drafted),
        accepted=tuple(a / 2.0 for a in state.accepted),
        weight=state.weight / 2.0 if prior_decay else state.weight,
    )
    return rates, decayed
