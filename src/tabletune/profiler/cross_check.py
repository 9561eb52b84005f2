"""Both timing methods on the same cells, in the same launch: do they agree on pure decode?

After an in-flight grid, a few batch sizes are timed again at every k with the request method,
its prompts as long as the in-flight cell's mean context (the long request decodes at contexts
prompt + 1 .. prompt + n, so their middle matches), since the step time grows with context. The
agreement is the median over cells of in-flight / request - 1.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tabletune.profiler.engine import EngineHttp
from tabletune.profiler.measure import TimingMeasurer, check_k_applied
from tabletune.profiler.progress import Reporter
from tabletune.profiler.records import RawSample
from tabletune.profiler.settings import TimingSettings
from tabletune.profiler.timing import CellDetails, CellKey

AGREEMENT_GOAL = 0.03
"""the methods agree when the median difference over cells is within 3 %"""


def request_prompt_tokens(context_tokens: float, decode_tokens: int) -> int:
    """A prompt length whose request-method decode steps run at ``context_tokens`` on average."""
    return max(1, round(context_tokens - (decode_tokens + 1) / 2))


@dataclass(frozen=True)
class CellAgreement:
    batch_size: int
    k: int
    in_flight_ms: float
    request_ms: float

    @property
    def difference(self) -> float:
        """in-flight / request - 1"""
        return self.in_flight_ms / self.request_ms - 1.0


@dataclass(frozen=True)
class Agreement:
    cells: tuple[CellAgreement, ...]

    @property
    def median_difference(self) -> float:
        return float(statistics.median(c.difference for c in self.cells))

    @property
    def median_abs_difference(self) -> float:
        return float(statistics.median(abs(c.difference) for c in self.cells))

    @property
    def agree(self) -> bool:
        return abs(self.median_difference) <= AGREEMENT_GOAL

    def to_json(self) -> dict[str, Any]:
        return {
            "median_difference": round(self.median_difference, 4),
            "median_abs_difference": round(self.median_abs_difference, 4),
            "goal": AGREEMENT_GOAL,
            "agree": self.agree,
            "cells": [
                {
                    "batch_size": c.batch_size,
                    "k": c.k,
                    "in_flight_ms": round(c.in_flight_ms, 4),
                    "request_ms": round(c.request_ms, 4),
                    "difference": round(c.difference, 4),
                }
                for c in self.cells
            ],
        }


def agreement(
    in_flight: Mapping[CellKey, Sequence[float]], request: Mapping[CellKey, Sequence[float]]
) -> Agreement:
    """Cell medians of both methods, over the cells both timed."""
    cells = tuple(
        CellAgreement(b, k, statistics.median(in_flight[(b, k)]), statistics.median(values))
        for (b, k), values in sorted(request.items(), key=lambda item: (item[0][1], item[0][0]))
        if (b, k) in in_flight
    )
    if not cells:
        raise ValueError("no cell timed by both methods")
    return Agreement(cells)


def _mean_context(
    details: Mapping[CellKey, CellDetails], batch: int, ks: Sequence[int], default: float
) -> float:
    """The in-flight cells' mean context at ``batch`` (over k)."""
    contexts = [
        c for k in ks if (c := details.get((batch, k), CellDetails()).context_tokens) is not None
    ]
    return statistics.fmean(contexts) if contexts else default


def time_by_request(
    engine: EngineHttp,
    batches: Sequence[int],
    ks: Sequence[int],
    *,
    timing: TimingSettings,
    details: Mapping[CellKey, CellDetails],
    max_num_seqs: int,
    temperature: float,
    reporter: Reporter,
    on_sample: Callable[[RawSample], None],
) -> dict[CellKey, list[float]]:
    """The request method at ``batches`` x ``ks``, at the in-flight cells' contexts."""
    out: dict[CellKey, list[float]] = {}
    reporter.phase("cross-check (request method)", len(batches) * len(ks) * timing.repeats)
    for k in ks:
        measurers = {
            batch: TimingMeasurer(
                engine,
                settings=replace(
                    timing,
                    prompt_tokens=request_prompt_tokens(
                        _mean_context(details, batch, ks, timing.prompt_tokens),
                        timing.decode_tokens,
                    ),
                    seed=timing.seed + 1000 + batch,
                ),
                max_num_seqs=max_num_seqs,
                temperature=temperature,
                reporter=reporter,
                on_sample=on_sample,
            )
            for batch in batches
        }
        measurers[batches[0]].set_k(k)  # and warm up
        before = engine.counters()
        for batch, measurer in measurers.items():
            out[(batch, k)] = measurer.cell(batch, k)
            for _ in range(timing.repeats):
                reporter.advance(f"k={k} B={batch}")
        check_k_applied(engine.counters().minus(before), k)
    reporter.done()
    return out
