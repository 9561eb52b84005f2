"""Step-cell families: the names, labels and values the plugin and the emulator both expose."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from tabletune import metric_names as names
from tabletune.plugin.step_metrics import EngineSteps, step_cell_families
from tabletune.step_cells import StepCellCounter, cells_from_wire


class _Fixed(Collector):
    def __init__(self, engines: list[EngineSteps]) -> None:
        self._engines = engines

    def collect(self) -> Iterator[Metric]:
        yield from step_cell_families(self._engines)


def _exposition(engines: list[EngineSteps]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(_Fixed(engines))
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_counters_carry_each_cell_with_its_k_and_batch_label_and_the_start_time() -> None:
    counter = StepCellCounter()
    counter.record(batch_size=130, k=3, duration_s=0.5, tokens=700)
    counter.record(batch_size=136, k=3, duration_s=0.25, tokens=544)
    counter.record(batch_size=7, k=0, duration_s=0.125, tokens=7)
    counter.record_without_decode()
    cells, without = cells_from_wire(counter.to_wire())
    samples = _exposition([EngineSteps(("m", "0"), cells, without, created=1234.0)])
    cell = (("batch", "129-136"), ("engine", "0"), ("k", "3"), ("model_name", "m"))
    assert samples[(f"{names.TT_STEPS}_total", cell)] == 2
    assert samples[(f"{names.TT_STEP_SECONDS}_total", cell)] == 0.75
    assert samples[(f"{names.TT_STEP_SECONDS_SQUARED}_total", cell)] == 0.3125
    assert samples[(f"{names.TT_STEP_TOKENS}_total", cell)] == 1244
    assert samples[(f"{names.TT_STEP_REQUESTS}_total", cell)] == 266
    assert samples[(f"{names.TT_STEPS}_created", cell)] == 1234.0
    small = (("batch", "7"), ("engine", "0"), ("k", "0"), ("model_name", "m"))
    assert samples[(f"{names.TT_STEPS}_total", small)] == 1
    engine = (("engine", "0"), ("model_name", "m"))
    assert samples[(f"{names.TT_STEPS_WITHOUT_DECODE}_total", engine)] == 1


def test_no_engine_read_yet_exposes_the_families_without_samples() -> None:
    assert _exposition([]) == {}
