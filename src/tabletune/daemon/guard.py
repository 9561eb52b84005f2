"""The push guard: measured goodput at similar load before and after a push.

Goodput is kept tokens per second (vLLM's generation-token counter over the interval); load is
the mean decode batch. A sample after the push is compared only with samples before it whose
load was within ``load_tolerance``, because goodput grows with load and a load change alone
must not look like a regression. Each sample is divided by what the model predicts for the
table that ran, over that interval's batch sizes, with the acceptance measured in that same
interval: traffic whose acceptance changes around a push then does not look like a
regression, while a table that runs slower than the profile promised does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tabletune.admin.protocol import TableView
from tabletune.daemon.loads import step_loads
from tabletune.daemon.observation import Observation
from tabletune.daemon.profiles import PoolProfile
from tabletune.daemon.settings import GuardSettings
from tabletune.schemas.table import Range, TableError, normalize_ranges
from tabletune.solver import SolverError, StepTimes, expand, tau


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
    loads: Mapping[tuple[int, int], float],
    rates: Sequence[float],
    *,
    max_k: int,
    exploration_interval: int = 0,
    t_ms: Callable[[int, int], float] | None = None,
) -> float | None:
    """Model goodput (tokens/s) of ``ranges`` over the interval's steps: ``loads`` maps
    inclusive batch ranges to step counts (spread evenly inside a range). With exploration,
    one step in ``exploration_interval`` runs at K instead (the plugin's probe)."""
    tokens = 0.0
    busy_ms = 0.0
    top = step_times.max_batch
    step_ms = t_ms or step_times.at
    probe = 1.0 / exploration_interval if exploration_interval > 0 else 0.0
    try:
        per_batch = expand(ranges, top)
        for (low, high), steps in loads.items():
            share = steps / (high - low + 1)
            for b in range(low, high + 1):
                batch = min(max(1, b), top)
                k = min(per_batch[batch - 1], max_k)
                mix = [(k, 1.0)] if k >= max_k or not probe else [(k, 1 - probe), (max_k, probe)]
                for step_k, part in mix:
                    tokens += part * share * b * tau(rates, step_k)
                    busy_ms += part * share * step_ms(batch, step_k) * (b / batch)
    except (SolverError, KeyError):
        return None
    return 1000.0 * tokens / busy_ms if busy_ms > 0 else None


def view_ranges(view: TableView) -> tuple[Range, ...] | None:
    """The view's table as ranges; None when static or unreadable."""
    if view.table is None:
        return None
    try:
        return normalize_ranges(view.table)
    except TableError:
        return None


def goodput_sample(
    pool: PoolProfile,
    ran_view: TableView,
    obs: Observation,
    fallback_rates: Sequence[float],
    now: float,
) -> GoodputSample | None:
    """Measured vs predicted goodput of the table that ran during the interval. The prediction
    uses the profile, a fixed yardstick, so a push that made steps slower than the model
    promised shows as lower efficiency."""
    ran = view_ranges(ran_view)
    if obs.mean_batch is None or ran is None:
        return None
    rates = interval_rates(obs.drafted, obs.accepted, fallback_rates)
    point = max(1, round(obs.mean_batch))
    loads = step_loads(obs) or {(point, point): 1.0}
    predicted = predicted_tokens_per_s(
        pool.step_times,
        ran,
        loads,
        rates,
        max_k=ran_view.num_speculative_tokens,
        exploration_interval=ran_view.exploration_interval,
        t_ms=pool.t_ms,
    )
    if not predicted:
        return None
    return GoodputSample(now, obs.mean_batch, obs.tokens_per_s, predicted)


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


def _usable(samples: Iterable[GoodputSample]) -> list[GoodputSample]:
    return [s for s in samples if s.load >= 0.5 and s.tokens_per_s > 0 and s.predicted_per_s > 0]


def judge(
    before: Sequence[GoodputSample],
    after: Sequence[GoodputSample],
    *,
    elapsed_s: float,
    settings: GuardSettings,
) -> Verdict:
    """Each sample after the push against the samples before it at a similar load (within
    ``load_tolerance``); the change is the mean of those ratios."""
    b, a = _usable(before), _usable(after)
    ratios: list[float] = []
    used: set[int] = set()
    for sample in a:
        close = [
            i
            for i, old in enumerate(b)
            if abs(old.load - sample.load) <= settings.load_tolerance * max(old.load, 1.0)
        ]
        if not close:
            continue
        used.update(close)
        reference = sum(b[i].efficiency for i in close) / len(close)
        ratios.append(sample.efficiency / reference)
    counts = (len(used), len(ratios))
    if min(counts) < settings.min_samples:
        outcome: Literal["wait", "inconclusive"] = (
            "wait" if elapsed_s < settings.window_s else "inconclusive"
        )
        return Verdict(outcome, samples=counts)
    change = sum(ratios) / len(ratios) - 1.0
    verdict: Literal["ok", "drop"] = "drop" if change < -settings.max_drop else "ok"
    return Verdict(verdict, change=change, samples=counts)


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
