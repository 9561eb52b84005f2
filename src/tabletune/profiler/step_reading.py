"""The plugin's step cells as read from vLLM's /metrics, and what a window of them says. Pure.

The engine core counts every step that decodes into its cell (k = the drafts it verified,
batch cell of B = its scheduled requests): steps, seconds, seconds squared, scheduled tokens,
scheduled requests (``tabletune.step_cells``); a step drafting another k than it verified (the
last before a new k) goes to the switch counters instead, prefill-only steps to
``steps_without_decode``. The HTTP side exports the engine's totals as of its last sync. Two
readings give the increase over the steps between their syncs; ``window_problem`` says whether
that increase is exactly the steps wanted: B requests decoding at k and nothing else (or,
under a prefill stream, B requests decoding with prefill of other requests riding along).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from tabletune import metric_names as names
from tabletune.profiler.errors import MeasurementError
from tabletune.step_cells import (
    CellKey,
    CellTotals,
    cell_key,
    cell_label,
    cell_of,
    parse_cell_label,
)

CELL_SAMPLES = (  # in CellTotals' field order
    f"{names.TT_STEPS}_total",
    f"{names.TT_STEP_SECONDS}_total",
    f"{names.TT_STEP_SECONDS_SQUARED}_total",
    f"{names.TT_STEP_TOKENS}_total",
    f"{names.TT_STEP_REQUESTS}_total",
)
WITHOUT_DECODE = f"{names.TT_STEPS_WITHOUT_DECODE}_total"
SWITCH_STEPS = f"{names.TT_SWITCH_STEPS}_total"
_PREFIXES = ("tabletune_step", "tabletune_k_switch")
STREAM_OVERLAP = 8
NO_STEPS = "no step in the window"
"""under a prefill stream, steps with up to this many requests beyond B count as B's"""


@dataclass(frozen=True)
class StepReading:
    """Step-cell totals of the engine(s) behind one /metrics (sums since the engine started)."""

    cells: Mapping[CellKey, CellTotals] = field(default_factory=dict)
    steps_without_decode: float = 0.0
    switch_steps: float = 0.0

    @property
    def decoding(self) -> CellTotals:
        """The totals of every cell together: the steps that decoded."""
        return sum(self.cells.values(), CellTotals())

    @property
    def engine_steps(self) -> float:
        """Every step the engine timed: decoding, prefill-only and switch steps."""
        return self.decoding.steps + self.steps_without_decode + self.switch_steps

    def since(self, earlier: StepReading) -> StepReading:
        """The increase from ``earlier``; MeasurementError when a counter went back (the engine
        restarted, or another engine answered)."""
        cells = {}
        for key, totals in self.cells.items():
            before = earlier.cells.get(key, CellTotals())
            if totals.went_back_from(before):
                raise MeasurementError(f"step cell {key} went back: did the engine restart?")
            cells[key] = totals.since(before)
        if any(key not in self.cells for key in earlier.cells) or (
            self.steps_without_decode < earlier.steps_without_decode
        ):
            raise MeasurementError("step counters went back: did the engine restart?")
        return StepReading(
            {key: t for key, t in cells.items() if t.steps > 0},
            self.steps_without_decode - earlier.steps_without_decode,
            self.switch_steps - earlier.switch_steps,
        )

    def cell(self, k: int, batch: int) -> CellTotals:
        return self.cells.get(cell_key(k, batch), CellTotals())


# name, {labels}, value, an optional timestamp (the exposition format's sample line)
_SAMPLE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)[ \t]*(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+-?\d+)?[ \t]*"
)
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(?:,|$)')
_ESCAPE = re.compile(r'\\[\\"n]')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_step_reading(text: str) -> StepReading:
    """The step cells in a /metrics text, summed over engines. Only the plugin's lines are
    parsed, by hand: the profiler reads thousands of times a grid, and a read through
    prometheus_client's parser took 34 ms on the H200 against 19 ms with this one (two launches,
    bench/results/profile_fast_warm_h200.json and profile_fast_fastread_h200.json)."""
    sums: dict[CellKey, list[float]] = {}
    without = switches = 0.0
    for line in text.split("\n"):
        if not line.startswith(_PREFIXES):
            continue
        match = _SAMPLE.fullmatch(line)
        if match is None:
            raise MeasurementError(f"/metrics: not a sample line: {line[:200]!r}")
        name, label_text, value_text = match.groups()
        try:
            value = float(value_text)
        except ValueError:
            raise MeasurementError(f"/metrics: not a number: {line[:200]!r}") from None
        if name in CELL_SAMPLES:
            key = _cell_key(name, label_text or "")
            sums.setdefault(key, [0.0] * 5)[CELL_SAMPLES.index(name)] += value
        elif name == WITHOUT_DECODE:
            without += value
        elif name == SWITCH_STEPS:
            switches += value
    return StepReading({key: CellTotals(*row) for key, row in sums.items()}, without, switches)


@functools.lru_cache(maxsize=4096)  # the same few hundred label sets come back every read
def _cell_key(name: str, label_text: str) -> CellKey:
    labels = _labels(label_text)
    try:
        return (int(labels[names.LABEL_K]), *parse_cell_label(labels[names.LABEL_BATCH]))
    except (KeyError, ValueError):
        raise MeasurementError(f"/metrics: {name} with labels {labels}: not a step cell") from None


def _labels(text: str) -> dict[str, str]:
    """The labels between a sample's braces, unescaped."""
    labels: dict[str, str] = {}
    text = text.rstrip(" \t")
    at = 0
    while at < len(text):
        label = _LABEL.match(text, at)
        if label is None:
            raise MeasurementError(f"/metrics: labels do not parse: {{{text[:200]}}}")
        raw = label[2]
        labels[label[1]] = _ESCAPE.sub(lambda m: _UNESCAPE[m[0]], raw) if "\\" in raw else raw
        at = label.end()
    return labels


def _same(value: float, expected: float) -> bool:
    return math.isclose(value, expected, rel_tol=1e-9, abs_tol=1e-6)


def window_totals(window: StepReading, batch: int, k: int, *, stream: bool) -> CellTotals:
    """The steps of a window that count as "B requests decoding at k": the cell of B, and under
    a prefill stream also the cells up to B + STREAM_OVERLAP (B decoding plus arrivals)."""
    if not stream:
        return window.cell(k, batch)
    wanted = {cell_of(b) for b in range(batch, batch + STREAM_OVERLAP + 1)}
    out = CellTotals()
    for (kk, low, high), totals in window.cells.items():
        if kk == k and (low, high) in wanted:
            out = out + totals
    return out


def _strays(window: StepReading, batch: int, *, stream: bool) -> list[str]:
    """Steps that show a batch size other than B's (any k), and prefill-only steps."""
    if stream:
        cells = {cell_label((low, high)) for (_, low, high) in window.cells if high < batch}
        return sorted(cells)
    others = {cell_label((low, high)) for (_, low, high) in window.cells} - {
        cell_label(cell_of(batch))
    }
    without = (
        [f"{window.steps_without_decode:.0f} prefill-only"] if window.steps_without_decode else []
    )
    return sorted(others) + without


def window_problem(window: StepReading, batch: int, k: int, *, stream: bool = False) -> str | None:
    """Why the window's steps at k are not B requests decoding (None: they are).

    Pure decode: every step in the cell of B had exactly B requests and B * (1 + k) tokens, no
    step ran at another batch size (any k: the tail of the previous k is fine), and no step only
    prefilled. Under a prefill stream: every step had B to B + STREAM_OVERLAP requests and at
    least B * (1 + k) tokens, and none ran with fewer than B.
    """
    mine = window_totals(window, batch, k, stream=stream)
    where = f"B={batch} k={k}"
    strays = _strays(window, batch, stream=stream)
    if strays:
        return f"{where}: steps at other batch sizes ({', '.join(strays)})"
    if mine.steps <= 0:
        return f"{where}: {NO_STEPS}"
    if stream:
        if mine.requests < mine.steps * batch - 1e-6:
            return f"{where}: {mine.mean_batch:.2f} requests per step, fewer than {batch}"
        if mine.tokens < mine.steps * batch * (1 + k) - 1e-6:
            return f"{where}: {mine.mean_tokens:.1f} tokens per step, fewer than B*(1+k)"
        return None
    if not _same(mine.requests, mine.steps * batch):
        return f"{where}: {mine.mean_batch:.2f} requests per step in its cell, not {batch}"
    extra = mine.tokens - mine.steps * batch * (1 + k)
    if not _same(extra, 0.0):
        return f"{where}: {extra / mine.steps:+.1f} tokens per step beyond B*(1+k): prefill"
    return None


def window_broken(window: StepReading, batch: int, k: int, *, stream: bool = False) -> bool:
    """The window can no longer become B requests decoding at k: waiting longer will not help
    (it has wrong steps, not merely too few)."""
    problem = window_problem(window, batch, k, stream=stream)
    return problem is not None and not problem.endswith(NO_STEPS)
