"""``/metrics`` of an emulated engine: vLLM 0.26's series and the plugin's, read from the
engine's counters at scrape time (a collector over one replica, in that replica's own
``CollectorRegistry``; nothing global).

Names, types and label names are the ones vLLM and the plugin use (``tabletune.metric_names``;
the step-time cells through the plugin's own ``step_cell_families``); a test compares them with
the plugin's families. Counters carry ``_created`` = the wall time the engine (re)started, so a
restart shows to Prometheus exactly as vLLM's does: counters back at zero, a new ``_created``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Protocol

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tabletune import metric_names as names
from tabletune.admin.protocol import StepCellsRead
from tabletune.plugin.controller import EngineTableController
from tabletune.plugin.step_metrics import EngineSteps, step_cell_families
from tabletune.sim.engine import EngineSim

ENGINE_LABELS = [names.LABEL_MODEL, names.LABEL_ENGINE]
VLLM_NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"


class MetricsSource(Protocol):
    """What the collector reads (a ``Replica``)."""

    @property
    def engine(self) -> EngineSim: ...

    @property
    def controller(self) -> EngineTableController: ...

    @property
    def created_wall(self) -> float: ...

    @property
    def label_values(self) -> tuple[str, str]: ...

    def step_cells(self) -> StepCellsRead: ...


class SimCollector(Collector):
    """Reads one replica's engine and engine side at every scrape."""

    def __init__(self, source: MetricsSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        source = self._source
        engine = source.engine
        c = engine.counters
        base = list(source.label_values)
        created = source.created_wall
        big_k = engine.num_speculative_tokens

        def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, documentation, labels=ENGINE_LABELS)
            family.add_metric(base, value, created=created)
            return family

        def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, documentation, labels=ENGINE_LABELS)
            family.add_metric(base, value)
            return family

        def per_position(name: str, documentation: str, values: np.ndarray) -> Metric:
            family = CounterMetricFamily(
                name, documentation, labels=[*ENGINE_LABELS, names.LABEL_POSITION]
            )
            for position in range(big_k):
                family.add_metric([*base, str(position)], float(values[position]), created=created)
            return family

        # vLLM 0.26
        yield gauge(
            names.VLLM_NUM_REQUESTS_RUNNING,
            "Number of requests in model execution batches.",
            engine.running(),
        )
        yield gauge(
            VLLM_NUM_REQUESTS_WAITING,
            "Number of requests waiting to be processed.",
            engine.waiting(),
        )
        yield counter(
            names.VLLM_GENERATION_TOKENS,
            "Number of generation tokens processed.",
            c.generation_tokens,
        )
        yield counter(names.VLLM_NUM_DRAFTS, "Number of spec decoding drafts.", c.num_drafts)
        yield counter(names.VLLM_NUM_DRAFT_TOKENS, "Number of draft tokens.", c.num_draft_tokens)
        yield counter(
            names.VLLM_NUM_ACCEPTED_TOKENS, "Number of accepted tokens.", c.num_accepted_tokens
        )
        yield per_position(
            names.VLLM_ACCEPTED_PER_POS, "Accepted tokens per draft position.", c.accepted_per_pos
        )

        # The TableTune plugin
        yield per_position(
            names.TT_DRAFT_TOKENS_PER_POS,
            "Draft tokens per draft position.",
            c.draft_tokens_per_pos,
        )
        cells = source.step_cells()
        yield from step_cell_families(
            [
                EngineSteps(
                    source.label_values,
                    cells.cells,
                    cells.steps_without_decode,
                    cells.started_at,
                    switch_steps=cells.switch_steps,
                    switch_seconds=cells.switch_seconds,
                )
            ]
        )
        state = source.controller.state
        yield gauge(
            names.TT_TABLE_VERSION,
            "Version of the batch-size table (bumped on every accepted change).",
            state.version,
        )
        ranges = GaugeMetricFamily(
            names.TT_TABLE_RANGE_K,
            "Draft length k of each range of the batch-size table.",
            labels=[*ENGINE_LABELS, names.LABEL_RANGE_START, names.LABEL_RANGE_END],
        )
        for start, end, k in state.ranges or ():
            ranges.add_metric([*base, str(start), str(end)], k)
        yield ranges
        yield counter(
            names.TT_EXPLORATION_STEPS,
            "Number of steps run at the longest draft length by exploration.",
            source.controller.exploration_steps,
        )


def _go_float(value: float) -> str:
    """A sample value as prometheus_client writes it (Go's formatting of floats)."""
    text = repr(float(value))
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


@functools.lru_cache(maxsize=4096)  # label values repeat on every line and every scrape
def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render(registry: CollectorRegistry) -> bytes:
    """The text format (0.0.4), byte for byte what ``generate_latest`` writes for these
    families, without its per-sample name validation: a scrape of one engine costs about a
    quarter, which is what lets one process serve a thousand engines."""
    out: list[str] = []
    for metric in registry.collect():
        name = f"{metric.name}_total" if metric.type == "counter" else metric.name
        help_text = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {metric.type}\n")
        created_name = f"{metric.name}_created"
        created: list[str] = []
        for sample in metric.samples:
            labels = ",".join(
                f'{key}="{_escape_value(value)}"' for key, value in sorted(sample.labels.items())
            )
            line = (
                f"{sample.name}{{{labels}}} {_go_float(sample.value)}\n"
                if labels
                else f"{sample.name} {_go_float(sample.value)}\n"
            )
            (created if sample.name == created_name else out).append(line)
        if created:
            out.append(f"# HELP {created_name} {help_text}\n# TYPE {created_name} gauge\n")
            out.extend(created)
    return "".join(out).encode("utf-8")


def registry_for(source: MetricsSource) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SimCollector(source))
    return registry
