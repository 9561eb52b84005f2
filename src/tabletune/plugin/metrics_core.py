"""The plugin's Prometheus metrics, without vLLM: families, per-engine children, per-step update.

Names and labels come from ``tabletune.metric_names``; label order and HELP style follow vLLM
0.26's own spec-decode metrics (``model_name``, ``engine``, then ``position``). Metrics register
into the registry vLLM's ``/metrics`` serves (prometheus_client's default one in the API-server
process); vLLM builds one stat logger per engine, so families are made once per registry.
Step times are not measured here: the engine core counts them (step_timer.py) and the HTTP
side's sync loop hands each reading to ``EngineMetrics.publish_steps``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import ClassVar, Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from tabletune import metric_names as names
from tabletune.admin.protocol import StepCellsRead, TableView
from tabletune.plugin.step_metrics import EngineSteps, StepCellCollector

ENGINE_LABELS = [names.LABEL_MODEL, names.LABEL_ENGINE]


class SpecStatsLike(Protocol):
    """The field of vLLM's ``SpecDecodingStats`` this plugin reads."""

    num_draft_tokens_per_pos: list[int]


class TableTuneMetrics:
    """The metric families, made once per registry."""

    _by_registry: ClassVar[weakref.WeakKeyDictionary[CollectorRegistry, TableTuneMetrics]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.draft_tokens_per_pos = Counter(
            names.TT_DRAFT_TOKENS_PER_POS,
            "Draft tokens per draft position.",
            labelnames=[*ENGINE_LABELS, names.LABEL_POSITION],
            registry=registry,
        )
        self.table_version = Gauge(
            names.TT_TABLE_VERSION,
            "Version of the batch-size table (bumped on every accepted change).",
            labelnames=ENGINE_LABELS,
            multiprocess_mode="mostrecent",
            registry=registry,
        )
        self.table_range_k = Gauge(
            names.TT_TABLE_RANGE_K,
            "Draft length k of each range of the batch-size table.",
            labelnames=[*ENGINE_LABELS, names.LABEL_RANGE_START, names.LABEL_RANGE_END],
            multiprocess_mode="mostrecent",
            registry=registry,
        )
        self.exploration_steps = Counter(
            names.TT_EXPLORATION_STEPS,
            "Number of steps run at the longest draft length by exploration.",
            labelnames=ENGINE_LABELS,
            registry=registry,
        )
        self.step_cells = StepCellCollector()
        registry.register(self.step_cells)

    @classmethod
    def shared(cls, registry: CollectorRegistry = REGISTRY) -> TableTuneMetrics:
        found = cls._by_registry.get(registry)
        if found is None:
            found = cls._by_registry[registry] = cls(registry)
        return found

    def for_engine(self, *, model_name: str, engine: str) -> EngineMetrics:
        return EngineMetrics(self, model_name=model_name, engine=engine)


class EngineMetrics:
    """One engine's label-bound children; ``record_drafts`` runs once per engine step."""

    def __init__(self, metrics: TableTuneMetrics, *, model_name: str, engine: str) -> None:
        self._metrics = metrics
        self._labels = (model_name, engine)
        self._per_pos: list[Counter] = []
        self._version = metrics.table_version.labels(*self._labels)
        self._exploration = metrics.exploration_steps.labels(*self._labels)
        self._ranges: set[tuple[str, str]] = set()
        self._exploration_seen = 0

    def ensure_positions(self, count: int) -> None:
        """Make the per-position children 0..count-1 exist (so they export 0 from the start)."""
        while len(self._per_pos) < count:
            position = str(len(self._per_pos))
            self._per_pos.append(self._metrics.draft_tokens_per_pos.labels(*self._labels, position))

    def record_drafts(self, spec: SpecStatsLike | None) -> None:
        """One step's draft tokens per position (vLLM publishes only the accepted ones)."""
        if spec is None:
            return
        per_pos = spec.num_draft_tokens_per_pos
        self.ensure_positions(len(per_pos))
        for counter, drafted in zip(self._per_pos, per_pos, strict=False):
            if drafted:
                counter.inc(drafted)

    def publish_steps(self, read: StepCellsRead) -> None:
        """The engine's step-cell totals as last read (a restart shows as a new ``_created``)."""
        self._metrics.step_cells.update(
            EngineSteps(
                self._labels,
                read.cells,
                read.steps_without_decode,
                read.started_at,
                switch_steps=read.switch_steps,
                switch_seconds=read.switch_seconds,
            )
        )

    def publish_table(self, ranges: Iterable[Sequence[int]] | None, version: int) -> None:
        self._version.set(version)
        current = set()
        for start, end, k in ranges or ():
            key = (str(start), str(end))
            current.add(key)
            self._metrics.table_range_k.labels(*self._labels, *key).set(k)
        for stale in self._ranges - current:
            self._metrics.table_range_k.remove(*self._labels, *stale)
        self._ranges = current

    def publish_view(self, view: TableView) -> None:
        self.publish_table(view.table, view.version)
        seen = view.exploration_steps
        # A smaller count means the engine restarted: count from zero again.
        delta = seen - self._exploration_seen if seen >= self._exploration_seen else seen
        if delta:
            self._exploration.inc(delta)
        self._exploration_seen = seen
