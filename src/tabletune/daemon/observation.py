"""What a source reports about one replica for one evaluation interval (deltas, not totals).

Both sources (direct scrape and Prometheus) produce these, so everything downstream is
indifferent to where the numbers came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tabletune.step_cells import StepCells

# (k, batch_bucket label) -> (sum of step seconds, number of steps)
StepTimeDeltas = Mapping[tuple[int, str], tuple[float, float]]
# inclusive (low, high) batch sizes -> number of steps in that bucket
LoadBuckets = Mapping[tuple[int, int], float]


@dataclass(frozen=True)
class Observation:
    """Counter increases of one replica over ``interval_s`` seconds."""

    replica: str
    admin_url: str
    interval_s: float
    drafted: tuple[float, ...]  # per draft position, index 0 = first guess
    accepted: tuple[float, ...]
    load_buckets: LoadBuckets = field(default_factory=dict)
    mean_batch: float | None = None  # mean decode batch (histogram) or running requests
    generated_tokens: float = 0.0
    step_times: StepTimeDeltas = field(default_factory=dict)
    step_cells: StepCells = field(default_factory=dict)  # (k, low, high) -> increases
    steps_without_decode: float = 0.0
    reset: bool = False  # a counter went back: the engine restarted
    model_name: str | None = None

    @property
    def new_drafts(self) -> float:
        """Drafts that guessed at least once (position 1 drafted)."""
        return self.drafted[0] if self.drafted else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.interval_s if self.interval_s > 0 else 0.0


@dataclass(frozen=True)
class SourceResult:
    """One collection: fresh observations, and replicas whose data is stale or missing."""

    observations: Mapping[str, Observation]
    problems: Mapping[str, str] = field(default_factory=dict)  # replica -> why no data
    outage: str | None = None  # the whole source failed (e.g. Prometheus down)
