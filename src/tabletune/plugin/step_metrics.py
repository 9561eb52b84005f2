"""The step-cell counters as Prometheus families, from totals. Pure (no registry, no vLLM).

The engine core counts the cells (``tabletune.step_cells.StepCellCounter``); the API-server side
and the emulator both publish them through ``step_cell_families``, so the two expose the same
names, labels and types by construction. Values are totals since the engine started, with
``_created`` = that start, so a restart shows exactly as vLLM's own counters do.
``StepCellCollector`` holds the latest reading per engine for a registry (the HTTP side's).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from tabletune import metric_names as names
from tabletune.step_cells import StepCells, cell_label

ENGINE_LABELS = (names.LABEL_MODEL, names.LABEL_ENGINE)
CELL_LABELS = (*ENGINE_LABELS, names.LABEL_K, names.LABEL_BATCH)


@dataclass(frozen=True)
class EngineSteps:
    """One engine's step cells as last read, with its label values and start time."""

    label_values: tuple[str, str]  # (model_name, engine)
    cells: StepCells
    steps_without_decode: float
    created: float  # wall time the engine started (counters count from there)
    switch_steps: float = 0.0  # steps drafting another k than they verified (not in the cells)
    switch_seconds: float = 0.0


def step_cell_families(engines: Iterable[EngineSteps]) -> list[CounterMetricFamily]:
    """The counter families of the step cells of ``engines`` (empty engines add nothing)."""
    fields: Sequence[tuple[str, str, str]] = (
        (names.TT_STEPS, "Engine steps that decoded, by verified draft length and batch cell.",
         "steps"),
        (names.TT_STEP_SECONDS, "Sum of the durations of those steps in seconds.", "seconds"),
        (names.TT_STEP_SECONDS_SQUARED, "Sum of the squared durations of those steps.",
         "seconds_sq"),
        (names.TT_STEP_TOKENS, "Sum of the tokens those steps scheduled (decode and prefill).",
         "tokens"),
        (names.TT_STEP_REQUESTS, "Sum of the requests those steps scheduled (their batch sizes).",
         "requests"),
    )  # fmt: skip
    families = [
        CounterMetricFamily(name, documentation, labels=CELL_LABELS)
        for name, documentation, _ in fields
    ]
    without = CounterMetricFamily(
        names.TT_STEPS_WITHOUT_DECODE,
        "Engine steps that scheduled only prefill (no draft length applies).",
        labels=ENGINE_LABELS,
    )
    switches = CounterMetricFamily(
        names.TT_SWITCH_STEPS,
        "Decoding steps that drafted another length than they verified (not in the cells).",
        labels=ENGINE_LABELS,
    )
    switch_seconds = CounterMetricFamily(
        names.TT_SWITCH_SECONDS,
        "Sum of the durations of those steps in seconds.",
        labels=ENGINE_LABELS,
    )
    for engine in engines:
        for (k, low, high), totals in sorted(engine.cells.items()):
            values = [*engine.label_values, str(k), cell_label((low, high))]
            for family, (_, _, attribute) in zip(families, fields, strict=True):
                family.add_metric(values, getattr(totals, attribute), created=engine.created)
        labels = list(engine.label_values)
        without.add_metric(labels, engine.steps_without_decode, created=engine.created)
        switches.add_metric(labels, engine.switch_steps, created=engine.created)
        switch_seconds.add_metric(labels, engine.switch_seconds, created=engine.created)
    return [*families, without, switches, switch_seconds]


class StepCellCollector(Collector):
    """Exposes the latest step cells read from each engine (one collector per registry).

    ``update`` replaces an engine's reading whole (the sync loop, every round); a scrape sees
    each engine's latest totals. Before the first reading there is nothing to expose.
    """

    def __init__(self) -> None:
        self._latest: dict[tuple[str, str], EngineSteps] = {}

    def update(self, engine: EngineSteps) -> None:
        self._latest[engine.label_values] = engine

    def collect(self) -> Iterator[Metric]:
        engines = list(self._latest.values())  # one snapshot: updates replace entries whole
        if engines:
            yield from step_cell_families(engines)

    def describe(self) -> Iterator[Metric]:
        yield from step_cell_families([])  # reserves the names in the registry
