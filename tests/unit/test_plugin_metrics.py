"""The stat-logger plugin and the metric families with stand-ins for vLLM's per-step stats and a
fresh registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from tabletune.admin.protocol import StepCellsRead, TableView
from tabletune.plugin import metrics as metrics_entry
from tabletune.plugin.metrics import make_stat_logger_class
from tabletune.plugin.metrics_core import TableTuneMetrics
from tabletune.step_cells import CellTotals

LABELS = {"model_name": "qwen3-4b", "engine": "0"}


@dataclass
class Spec:  # vLLM's SpecDecodingStats field the plugin reads
    num_draft_tokens_per_pos: list[int] = field(default_factory=list)


def stats(spec: Spec | None) -> tuple[Any, Any]:
    scheduler = SimpleNamespace(spec_decoding_stats=spec)
    iteration = SimpleNamespace(inter_token_latencies_iter=[0.005], time_to_first_tokens_iter=[])
    return scheduler, iteration


def config(table: list[list[int]] | None = None, k: int = 3) -> Any:
    spec = SimpleNamespace(num_speculative_tokens=k, num_speculative_tokens_per_batch_size=table)
    return SimpleNamespace(
        speculative_config=spec, model_config=SimpleNamespace(served_model_name="qwen3-4b")
    )


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


class Base:
    """Stands in for vLLM's StatLoggerBase (an ABC the plugin subclasses)."""


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {**LABELS, **labels})


def test_per_position_draft_counts_add_up(registry: CollectorRegistry) -> None:
    logger = make_stat_logger_class(Base, registry)(config(), 0)
    logger.record(*stats(Spec([4, 4, 4])))
    logger.record(*stats(Spec([2, 0, 0])))
    logger.record(*stats(None))  # a step without drafts
    logger.record(None, None)
    per_pos = [
        value(registry, "tabletune_spec_decode_num_draft_tokens_per_pos_total", position=str(i))
        for i in range(3)
    ]
    assert per_pos == [6, 4, 4]


def test_positions_export_zero_from_the_start(registry: CollectorRegistry) -> None:
    make_stat_logger_class(Base, registry)(config(k=4), 0)
    name = "tabletune_spec_decode_num_draft_tokens_per_pos_total"
    assert value(registry, name, position="3") == 0


def test_the_stat_logger_no_longer_times_steps(registry: CollectorRegistry) -> None:
    logger = make_stat_logger_class(Base, registry)(config(), 0)
    logger.record(*stats(Spec([5, 5, 5])))
    names = {family.name for family in registry.collect()}
    assert not names & {"tabletune_step_duration_seconds", "tabletune_decode_batch_size"}


def test_starting_table_published_as_version_0(registry: CollectorRegistry) -> None:
    make_stat_logger_class(Base, registry)(config([[1, 64, 3], [65, 256, 1]]), 0)
    assert value(registry, "tabletune_table_version") == 0
    assert value(registry, "tabletune_table_range_k", range_start="65", range_end="256") == 1


def view(table: list[list[int]], version: int, explored: int) -> TableView:
    return TableView(
        dynamic=True, table=table, version=version, allowed_k=[1, 3], num_speculative_tokens=3,
        max_num_seqs=256, exploration_interval=50, hysteresis=0, exploration_steps=explored,
        plugin_version="0.1.0", engine_version="0.26.0",
    )  # fmt: skip


def test_views_replace_ranges_and_count_exploration(registry: CollectorRegistry) -> None:
    engine = TableTuneMetrics.shared(registry).for_engine(model_name="qwen3-4b", engine="0")
    engine.publish_view(view([[1, 64, 3], [65, 256, 1]], 1, 10))
    engine.publish_view(view([[1, 256, 1]], 2, 25))
    assert value(registry, "tabletune_table_version") == 2
    assert value(registry, "tabletune_table_range_k", range_start="1", range_end="256") == 1
    assert value(registry, "tabletune_table_range_k", range_start="65", range_end="256") is None
    assert value(registry, "tabletune_exploration_steps_total") == 25
    engine.publish_view(view([[1, 256, 1]], 0, 4))  # engine restarted: its count began again
    assert value(registry, "tabletune_exploration_steps_total") == 29


def test_one_family_set_per_registry_for_several_engines() -> None:
    registry = CollectorRegistry()
    first = TableTuneMetrics.shared(registry)
    assert TableTuneMetrics.shared(registry) is first
    first.for_engine(model_name="m", engine="0")
    first.for_engine(model_name="m", engine="1")  # a second engine: no duplicate registration


def test_names_follow_vllms_conventions() -> None:
    registry = CollectorRegistry()
    TableTuneMetrics(registry)
    for family in registry.collect():
        assert family.documentation.endswith(".")
    labels = TableTuneMetrics(CollectorRegistry()).draft_tokens_per_pos._labelnames
    assert labels == ("model_name", "engine", "position")  # vLLM's per-position order


def test_entry_point_needs_vllm_only_when_resolved() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            _ = metrics_entry.TableTuneStatLogger
    else:
        from vllm.v1.metrics.loggers import StatLoggerBase

        assert issubclass(metrics_entry.TableTuneStatLogger, StatLoggerBase)
    with pytest.raises(AttributeError):
        _ = metrics_entry.NoSuchThing


def cells_read(started_at: float, steps: float) -> StepCellsRead:
    totals = CellTotals(steps, steps * 0.02, steps * 0.0004, steps * 520, steps * 130)
    return StepCellsRead({(3, 129, 136): totals}, 7.0, started_at)


def test_step_cells_are_exported_as_the_engines_totals(registry: CollectorRegistry) -> None:
    metrics = TableTuneMetrics.shared(registry)
    cell = {"k": "3", "batch": "129-136"}
    assert value(registry, "tabletune_steps_total", **cell) is None  # nothing read yet
    engine = metrics.for_engine(model_name="qwen3-4b", engine="0")
    engine.publish_steps(cells_read(1000.0, 50))
    engine.publish_steps(cells_read(1000.0, 80))  # a later reading replaces the earlier one
    assert value(registry, "tabletune_steps_total", **cell) == 80
    assert value(registry, "tabletune_step_seconds_total", **cell) == pytest.approx(1.6)
    assert value(registry, "tabletune_step_scheduled_requests_total", **cell) == 80 * 130
    assert value(registry, "tabletune_steps_created", **cell) == 1000.0
    assert value(registry, "tabletune_steps_without_decode_total") == 7
    engine.publish_steps(cells_read(2000.0, 3))  # the engine restarted: totals go back
    assert value(registry, "tabletune_steps_total", **cell) == 3
    assert value(registry, "tabletune_steps_created", **cell) == 2000.0


def test_each_engine_keeps_its_own_cells(registry: CollectorRegistry) -> None:
    metrics = TableTuneMetrics.shared(registry)
    metrics.for_engine(model_name="m", engine="0").publish_steps(cells_read(1.0, 5))
    metrics.for_engine(model_name="m", engine="1").publish_steps(cells_read(1.0, 9))
    labels = {"model_name": "m", "k": "3", "batch": "129-136"}
    assert registry.get_sample_value("tabletune_steps_total", {**labels, "engine": "0"}) == 5
    assert registry.get_sample_value("tabletune_steps_total", {**labels, "engine": "1"}) == 9


def test_the_step_cell_names_are_reserved_in_a_describing_registry() -> None:
    registry = CollectorRegistry(auto_describe=True)
    TableTuneMetrics(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Counter("tabletune_steps", "clash", registry=registry)
