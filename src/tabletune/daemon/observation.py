"""What a source reports about one replica for one evaluation interval (increases, not totals).

Both sources (direct scrape and Prometheus) produce these, so everything downstream is
indifferent to where the numbers came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tabletune.step_cells import StepCells


@dataclass(frozen=True)
class Observation:
    """Counter increases of one replica (summed over its engines) over ``interval_s`` seconds.

    ``step_cells`` holds the plugin's step cells: per (k, low, high) the steps that decoded in
    the interval and their sums (seconds, seconds squared, scheduled tokens, scheduled
    requests). ``mean_batch`` is Σ requests / Σ steps over every cell, or the mean of vLLM's
    running-requests gauge when no step decoded (or the plugin is absent).
    """

    replica: str
    admin_url: str
    interval_s: float
    drafted: tuple[float, ...]  # per draft position, index 0 = first guess
    accepted: tuple[float, ...]
    mean_batch: float | None = None
    generated_tokens: float = 0.0
    step_cells: StepCells = field(default_factory=dict)  # (k, low, high) -> increases
    steps_without_decode: float = 0.0  # steps that scheduled only prefill
    reset: bool = False  # the engine restarted inside the interval (counters went back)
    model_name: str | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.interval_s if self.interval_s > 0 else 0.0


@dataclass(frozen=True)
class SourceResult:
    """One collection: fresh observations, and replicas whose data is stale, missing or
    refused (no observation, so no push for them this cycle)."""

    observations: Mapping[str, Observation]
    problems: Mapping[str, str] = field(default_factory=dict)  # replica -> why no data
    outage: str | None = None  # the whole source failed (e.g. Prometheus down)
