"""Timing T(B, k) on a running engine: per k set "k at every batch size" through the plugin,
warm up, measure every grid cell ``repeats`` times, then re-measure the cells that disagree with
their neighbours. Counters check each k: the engine drafted exactly k and accepted nothing."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tabletune.profiler.engine import EngineHttp
from tabletune.profiler.errors import MeasurementError
from tabletune.profiler.metrics import SpecCounters
from tabletune.profiler.progress import Reporter
from tabletune.profiler.prompts import TokenPrompts
from tabletune.profiler.records import RawSample
from tabletune.profiler.settings import TimingSettings
from tabletune.profiler.timing import CellDetails, CellKey, median, step_ms, suspicious_cells

log = logging.getLogger("tabletune.profiler")


@dataclass
class TimingResult:
    samples: dict[CellKey, list[float]] = field(default_factory=dict)
    noisy: set[CellKey] = field(default_factory=set)
    remeasured: list[CellKey] = field(default_factory=list)
    details: dict[CellKey, CellDetails] = field(default_factory=dict)
    """what the cells' steps carried (context, tokens per step), where measured"""
    refused: list[str] = field(default_factory=list)
    """in-flight windows taken again, and why"""
    events: dict[str, int] = field(default_factory=dict)
    """in-flight: how often each costly thing happened (fresh starts, adds, k switches, windows)"""


def check_all_rejected(delta: SpecCounters) -> None:
    """Timing mode held: no guess was accepted over the window."""
    if delta.accepted_tokens > 0:
        raise MeasurementError(
            f"{delta.accepted_tokens:.0f} guesses were accepted while timing: the engine is not "
            "in timing mode (synthetic rejection sampler with all rates 0); steps then emit more "
            "than one token per request, so request lengths no longer count steps"
        )


def check_k_applied(delta: SpecCounters, k: int) -> None:
    """The table swap took effect (drafts of exactly k) and every guess was rejected."""
    if k == 0:
        if delta.draft_tokens > 0:
            raise MeasurementError(
                f"k=0 was set but the engine drafted {delta.draft_tokens:.0f} tokens: the table "
                "swap did not take effect"
            )
    else:
        if delta.drafts <= 0:
            raise MeasurementError(f"k={k} was set but the engine made no drafts")
        per_draft = delta.draft_tokens / delta.drafts
        if abs(per_draft - k) > 1e-9:
            raise MeasurementError(
                f"k={k} was set but drafts held {per_draft:.3f} tokens on average: the table "
                "swap did not take effect"
            )
    check_all_rejected(delta)


class TimingMeasurer:
    """Measures cells on one engine; every raw sample goes to ``on_sample`` as it is taken."""

    def __init__(
        self,
        engine: EngineHttp,
        *,
        settings: TimingSettings,
        max_num_seqs: int,
        temperature: float,
        reporter: Reporter,
        on_sample: Callable[[RawSample], None],
    ) -> None:
        self._engine = engine
        self._settings = settings
        self._max = max_num_seqs
        self._temperature = temperature
        self._reporter = reporter
        self._on_sample = on_sample
        self._prompts = TokenPrompts.for_timing(settings)

    def _run(self, batch: int, max_tokens: int) -> float:
        prompts = self._prompts.take(batch)
        return self._engine.complete(
            prompts, max_tokens=max_tokens, temperature=self._temperature
        ).elapsed_s

    def sample(self, batch: int, k: int, round_: int) -> float:
        short = self._run(batch, 1)
        long = self._run(batch, 1 + self._settings.decode_tokens)
        value = step_ms(short, long, self._settings.decode_tokens)
        self._on_sample(
            RawSample(
                batch_size=batch, k=k, short_s=short, long_s=long, step_ms=value, round=round_
            )
        )
        return value

    def set_k(self, k: int) -> None:
        self._engine.set_k_everywhere(k, self._max)
        self.warm_up()

    def warm_up(self) -> None:
        """A few unrecorded batches: lazy compilation and allocator growth happen here."""
        for batch in sorted({min(b, self._max) for b in self._settings.warmup_batches}):
            self._run(batch, 1 + min(8, self._settings.decode_tokens))

    def cell(self, batch: int, k: int) -> list[float]:
        """``repeats`` samples of one cell under whatever k the engine runs now."""
        return [self.sample(batch, k, 0) for _ in range(self._settings.repeats)]

    def measure(self, grid: Sequence[int], ks: Sequence[int]) -> TimingResult:
        result = TimingResult()
        repeats = self._settings.repeats
        self._reporter.phase("timing", len(ks) * len(grid) * repeats)
        for k in ks:
            self.set_k(k)
            before = self._engine.counters()
            for batch in grid:
                cell = result.samples.setdefault((batch, k), [])
                for _ in range(repeats):
                    cell.append(self.sample(batch, k, 0))
                    self._reporter.advance(f"k={k} B={batch}")
            delta = self._engine.counters().minus(before)
            check_k_applied(delta, k)
            row = ", ".join(f"{b}:{median(result.samples[(b, k)]):.2f}" for b in grid)
            self._reporter.note(
                f"k={k} done: {delta.drafts:.0f} drafts of exactly {k}, none accepted; "
                f"step ms by B: {row}"
            )
        self._reporter.done()
        self._remeasure(result, grid)
        return result

    def _again(self, suspects: list[CellKey], round_: int) -> dict[CellKey, list[float]]:
        fresh: dict[CellKey, list[float]] = {}
        for k in sorted({k for _, k in suspects}):
            self.set_k(k)
            for batch in [b for b, kk in suspects if kk == k]:
                fresh[(batch, k)] = []
                for _ in range(self._settings.repeats):
                    fresh[(batch, k)].append(self.sample(batch, k, round_))
                    self._reporter.advance(f"k={k} B={batch}")
        return fresh

    def _remeasure(self, result: TimingResult, grid: Sequence[int]) -> None:
        remeasure(
            result,
            grid,
            settings=self._settings,
            reporter=self._reporter,
            measure_again=self._again,
        )


def remeasure(
    result: TimingResult,
    grid: Sequence[int],
    *,
    settings: TimingSettings,
    reporter: Reporter,
    measure_again: Callable[[list[CellKey], int], dict[CellKey, list[float]]],
) -> None:
    """Re-measure suspicious cells (either method). A cell whose new round agrees with its
    neighbours was disturbed once: the new round becomes its samples (the raw record keeps
    every one). A cell still out of line keeps every round and, after the last, is flagged
    noisy."""
    factor = settings.outlier_factor
    suspects = suspicious_cells(result.samples, grid, factor=factor)
    for round_ in range(1, settings.remeasure_rounds + 1):
        if not suspects:
            break
        reporter.note(
            f"re-measuring {len(suspects)} cell(s) that disagree with their neighbours: "
            + ", ".join(f"B={b} k={k}" for b, k in suspects)
        )
        reporter.phase(f"re-measure {round_}", len(suspects) * settings.repeats)
        fresh = measure_again(suspects, round_)
        reporter.done()
        result.remeasured.extend(suspects)
        candidate = {**result.samples, **fresh}
        still = set(suspicious_cells(candidate, grid, factor=factor))
        for cell, values in fresh.items():
            if cell in still:
                result.samples[cell] = result.samples[cell] + values
            else:
                result.samples[cell] = values
        suspects = [cell for cell in suspects if cell in still]
    result.noisy = set(suspects)
    if suspects:
        reporter.note(
            "kept as measured and flagged noisy (not smoothed): "
            + ", ".join(f"B={b} k={k}" for b, k in suspects)
        )
