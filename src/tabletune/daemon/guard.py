"""The push guard: measured goodput at similar load before and after a push.

Goodput is kept tokens per second (vLLM's generation-token counter over the interval); load is
the mean decode batch. Samples are compared within the same batch bucket only, because goodput
grows with load and a load change alone must not look like a regression. Each sample is divided
by what the model predicts for the table that ran, with the acceptance measured in that same
interval: traffic whose acceptance changes around a push then does not look like a regression,
while a table that runs slower than the profile promised does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tabletune.daemon.settings import GuardSettings
from tabletune.metric_names import batch_bucket
from tabletune.schemas.table import Range
from tabletune.solver import SolverError, StepTimes, expand, goodput


@dataclass(frozen=True)
class GoodputSample:
    at: float
    load: float
    tokens_per_s: float  # measured
    predicted_per_s: float  # the model's goodput for the table that ran, same acceptance

    @property
    def efficiency(self) -> float:
        return self.tokens_per_s / self.predicted_per_s


def predicted_tokens_per_s(
    step_times: StepTimes,
    ranges: Sequence[Range],
    load: float,
    rates: Sequence[float],
    *,
    max_k: int,
) -> float | None:
    """Model goodput (tokens/s) of ``ranges`` at ``load`` for acceptance ``rates``."""
    batch = min(max(1, round(load)), step_times.max_batch)
    try:
        k = min(expand(ranges, batch)[-1], max_k)
        return 1000.0 * goodput(batch, k, step_times.at(batch, k), rates) * (load / batch)
    except SolverError:
        return None


def interval_rates(
    drafted: Sequence[float], accepted: Sequence[float], fallback: Sequence[float]
) -> tuple[float, ...]:
    """a_i measured over one interval where position i was drafted, else ``fallback``."""
    out = []
    for i, prior in enumerate(fallback):
        d = drafted[i] if i < len(drafted) else 0.0
        a = accepted[i] if i < len(accepted) else 0.0
        out.append(min(1.0, a / d) if d > 0 else prior)
    return tuple(out)


@dataclass(frozen=True)
class Verdict:
    outcome: Literal["wait", "ok", "drop", "inconclusive"]
    change: float | None = None  # after / before - 1 at similar load
    samples: tuple[int, int] = (0, 0)


def _by_bucket(samples: Iterable[GoodputSample]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for s in samples:
        if s.load >= 0.5 and s.tokens_per_s > 0 and s.predicted_per_s > 0:
            out.setdefault(batch_bucket(max(1, round(s.load))), []).append(s.efficiency)
    return out


def judge(
    before: Sequence[GoodputSample],
    after: Sequence[GoodputSample],
    *,
    elapsed_s: float,
    settings: GuardSettings,
) -> Verdict:
    """Compare goodput in the batch buckets both sides saw; weight by the smaller side."""
    b, a = _by_bucket(before), _by_bucket(after)
    common = sorted(set(b) & set(a))
    n_before = sum(len(b[key]) for key in common)
    n_after = sum(len(a[key]) for key in common)
    if n_before < settings.min_samples or n_after < settings.min_samples:
        outcome: Literal["wait", "inconclusive"] = (
            "wait" if elapsed_s < settings.window_s else "inconclusive"
        )
        return Verdict(outcome, samples=(n_before, n_after))
    weighted = 0.0
    total = 0.0
    for key in common:
        weight = float(min(len(a[key]), len(b[key])))
        ratio = (sum(a[key]) / len(a[key])) / (sum(b[key]) / len(b[key]))
        weighted += weight * ratio
        total += weight
    change = weighted / total - 1.0
    outcome2: Literal["ok", "drop"] = "drop" if change < -settings.max_drop else "ok"
    return Verdict(outcome2, change=change, samples=(n_before, n_after))


@dataclass
class PendingCheck:
    """A push under watch: what ran before it (the rollback target)."""

    pushed_at: float
    pushed: tuple[Range, ...]
    previous: tuple[Range, ...]
    before: tuple[GoodputSample, ...]


@dataclass
class GoodputHistory:
    """Recent samples of one replica (kept for ``keep_s`` seconds)."""

    keep_s: float
    samples: deque[GoodputSample] = field(default_factory=deque)

    def add(self, sample: GoodputSample) -> None:
        self.samples.append(sample)
        while self.samples and self.samples[0].at < sample.at - self.keep_s:
            self.samples.popleft()

    def since(self, t: float) -> tuple[GoodputSample, ...]:
        return tuple(s for s in self.samples if s.at > t)

    def until(self, t: float) -> tuple[GoodputSample, ...]:
        return tuple(s for s in self.samples if s.at <= t)

    def clear(self) -> None:
        self.samples.clear()
