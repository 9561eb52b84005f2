"""The stat-logger plugin with stand-ins for vLLM's per-step stats and a fresh registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tabletune.admin.protocol import TableView
from tabletune.plugin import metrics as metrics_entry
from tabletune.plugin.metrics import make_stat_logger_class
from tabletune.plugin.metrics_core import TableTuneMetrics, step_sample

LABELS = {"model_name": "qwen3-4b", "engine": "0"}


@dataclass
class Spec:  # vLLM's SpecDecodingStats fields the plugin reads
    num_drafts: int
    num_draft_tokens: int
    num_draft_tokens_per_pos: list[int] = field(default_factory=list)


def stats(spec: Spec | None, itls: list[float], first_tokens: int = 0) -> tuple[Any, Any]:
    scheduler = SimpleNamespace(spec_decoding_stats=spec)
    iteration = SimpleNamespace(
        inter_token_latencies_iter=itls, time_to_first_tokens_iter=[0.1] * first_tokens
    )
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
    logger.record(*stats(Spec(4, 12, [4, 4, 4]), [0.006] * 4))
    logger.record(*stats(Spec(2, 2, [2, 0, 0]), [0.005] * 2))
    per_pos = [
        value(registry, "tabletune_spec_decode_num_draft_tokens_per_pos_total", position=str(i))
        for i in range(3)
    ]
    assert per_pos == [6, 4, 4]


def test_positions_export_zero_from_the_start(registry: CollectorRegistry) -> None:
    make_stat_logger_class(Base, registry)(config(k=4), 0)
    name = "tabletune_spec_decode_num_draft_tokens_per_pos_total"
    assert value(registry, name, position="3") == 0


def test_step_duration_by_k_and_bucket(registry: CollectorRegistry) -> None:
    logger = make_stat_logger_class(Base, registry)(config(), 0)
    logger.record(*stats(Spec(5, 15, [5, 5, 5]), [0.012, 0.0061, 0.0061, 0.0061, 0.0061]))
    count = value(registry, "tabletune_step_duration_seconds_count", k="3", batch_bucket="4-7")
    total = value(registry, "tabletune_step_duration_seconds_sum", k="3", batch_bucket="4-7")
    assert count == 1 and total == pytest.approx(0.0061)
    assert value(registry, "tabletune_decode_batch_size_count") == 1
    assert value(registry, "tabletune_decode_batch_size_sum") == 5


def test_k0_steps_are_recorded_without_spec_stats(registry: CollectorRegistry) -> None:
    logger = make_stat_logger_class(Base, registry)(config(), 0)
    logger.record(*stats(None, [0.004]))
    assert value(registry, "tabletune_step_duration_seconds_count", k="0", batch_bucket="1") == 1


@pytest.mark.parametrize(
    ("spec", "itls", "first_tokens"),
    [
        (Spec(3, 7, [3, 3, 1]), [0.005] * 3, 0),  # mixed draft lengths
        (Spec(3, 9, [3, 3, 3]), [0.005] * 3, 1),  # a prefill finished in this step
        (Spec(3, 9, [3, 3, 3]), [], 0),  # no decode output
    ],
)
def test_unattributable_steps_are_left_out(
    spec: Spec, itls: list[float], first_tokens: int
) -> None:
    assert step_sample(spec, itls, first_tokens) is None


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
