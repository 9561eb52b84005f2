"""Per-unit (replica or pool) acceptance tracking around the solver's estimator.

The estimate is rebuilt every ``rebuild_every_drafts`` drafts (``rebuild_step``: a_hat, then the
live counts halved, and w halved with prior decay). One cycle may bring many times that many
drafts: its counts are then split evenly into the rebuilds they contain, in order, so recent
traffic dominates exactly as if the rebuilds had happened as the drafts arrived (the order of
drafts inside one cycle is unknown; an even split is the neutral guess). Between rebuilds the
last estimate stands, so decisions never rest on a handful of drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import structlog

from tabletune.daemon.settings import EstimatorSettings
from tabletune.daemon.state import UnitRecord
from tabletune.solver import EstimatorState, SolverError, estimate, observe, rebuild_step

log = structlog.get_logger("tabletune.daemon")


def fit_positions(counts: Sequence[float], size: int) -> tuple[float, ...]:
    """Counts per position padded with zeros / cut to the prior's K positions."""
    values = [float(c) for c in counts[:size]]
    return tuple(values + [0.0] * (size - len(values)))


def _scaled(values: Sequence[float], factor: float) -> tuple[float, ...]:
    return tuple(v * factor for v in values)


def repeated_rebuilds(
    state: EstimatorState,
    drafted: Sequence[float],
    accepted: Sequence[float],
    times: int,
    *,
    prior_decay: bool,
) -> tuple[tuple[float, ...], EstimatorState]:
    """``times`` x (``observe`` the same counts, then ``rebuild_step``), in closed form.

    Live counts L follow L_j = (L_{j-1} + c) / 2, so L_r = c + (L_0 - c) / 2^r; the last
    estimate sees L_{r-1} + c = 2 L_r, with the prior weight w / 2^(r-1) under prior decay.
    """
    if times < 1:
        raise ValueError("times must be >= 1")
    shrink = 0.5**times

    def after(live: Sequence[float], chunk: Sequence[float]) -> tuple[float, ...]:
        return tuple(c + (x - c) * shrink for x, c in zip(live, chunk, strict=True))

    live_d = after(state.drafted, drafted)
    live_a = after(state.accepted, accepted)
    live_a = tuple(min(a, d) for a, d in zip(live_a, live_d, strict=True))  # rounding guard
    weight_seen = state.weight * (0.5 ** (times - 1) if prior_decay else 1.0)
    rates = estimate(
        replace(state, weight=weight_seen, drafted=_scaled(live_d, 2), accepted=_scaled(live_a, 2))
    )
    final = replace(
        state,
        weight=state.weight * (shrink if prior_decay else 1.0),
        drafted=live_d,
        accepted=live_a,
    )
    return rates, final


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

    @classmethod
    def resume(cls, key: str, saved: UnitRecord, *, prior: Sequence[float]) -> UnitEstimator | None:
        """The unit as saved, or None (logged) when the prior changed or the record is bad."""
        if tuple(saved.prior) != tuple(prior):
            log.warning("prior changed since the state was saved; counts dropped", unit=key)
            return None
        try:
            state = EstimatorState(
                prior=tuple(saved.prior),
                weight=saved.weight,
                drafted=tuple(saved.drafted),
                accepted=tuple(saved.accepted),
            )
            if len(saved.rates) != len(state.prior):
                raise SolverError("rates and prior differ in length")
        except SolverError as error:
            log.warning(
                "saved estimator state incompatible, starting fresh", unit=key, error=str(error)
            )
            return None
        return cls(
            state=state,
            rates=tuple(saved.rates),
            drafts_since_rebuild=saved.drafts_since_rebuild,
            rebuilds=saved.rebuilds,
        )

    def record(self) -> UnitRecord:
        """What survives a restart of the daemon."""
        return UnitRecord(
            prior=self.state.prior,
            weight=self.state.weight,
            drafted=self.state.drafted,
            accepted=self.state.accepted,
            rates=self.rates,
            drafts_since_rebuild=self.drafts_since_rebuild,
            rebuilds=self.rebuilds,
        )

    def add(
        self,
        drafted: Sequence[float],
        accepted: Sequence[float],
        *,
        settings: EstimatorSettings,
    ) -> bool:
        """Add live counts; True when they completed at least one rebuild (new ``rates``)."""
        size = len(self.state.prior)
        d = fit_positions(drafted, size)
        # Counters are read a moment apart: never let accepted exceed drafted at a position.
        a = tuple(min(x, y) for x, y in zip(fit_positions(accepted, size), d, strict=True))
        every = float(settings.rebuild_every_drafts)
        new = d[0]
        total = self.drafts_since_rebuild + new
        if total < every or new <= 0:
            self.state = observe(self.state, d, a)
            self.drafts_since_rebuild = total
            return False
        count = int(total // every)
        head = (every - self.drafts_since_rebuild) / new  # share before the first rebuild
        step = every / new  # share between two rebuilds
        tail = max(0.0, 1.0 - head - (count - 1) * step)
        state = observe(self.state, _scaled(d, head), _scaled(a, head))
        rates, state = rebuild_step(state, prior_decay=settings.prior_decay)
        if count > 1:
            rates, state = repeated_rebuilds(
                state,
                _scaled(d, step),
                _scaled(a, step),
                count - 1,
                prior_decay=settings.prior_decay,
            )
        self.state = observe(state, _scaled(d, tail), _scaled(a, tail))
        self.rates = rates
        self.drafts_since_rebuild = tail * new
        self.rebuilds += count
        return True
