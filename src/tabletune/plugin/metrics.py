"""The ``vllm.stat_logger_plugins`` entry point (``tabletune_metrics``), API-server process.

vLLM requires the entry point to be a ``StatLoggerBase`` subclass, so the class is built on
first access (module ``__getattr__``) from vLLM's base; everything it does is in
``metrics_core`` and testable without vLLM via ``make_stat_logger_class(any_base)``.
vLLM calls ``record`` once per engine step with that step's ``SchedulerStats`` and
``IterationStats``; only the per-position draft counts are read here (step times are counted
in the engine core, see step_timer.py).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from tabletune.plugin.metrics_core import TableTuneMetrics


def make_stat_logger_class(base: type, registry: CollectorRegistry = REGISTRY) -> type:
    """A stat logger class deriving from ``base`` (vLLM's ``StatLoggerBase``), publishing into
    ``registry`` (by default the one vLLM's ``/metrics`` serves in the API-server process)."""

    class TableTuneStatLogger(base):  # type: ignore[misc]
        """Per-position draft counts and the starting table's gauges."""

        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            spec = vllm_config.speculative_config
            self._metrics = TableTuneMetrics.shared(registry).for_engine(
                model_name=str(vllm_config.model_config.served_model_name),
                engine=str(engine_index),
            )
            if spec is not None:
                self._metrics.ensure_positions(int(spec.num_speculative_tokens))
                table = spec.num_speculative_tokens_per_batch_size
                # Version 0 = the starting table; the HTTP side keeps it in step with the engine.
                self._metrics.publish_table(table, 0)

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is not None:
                self._metrics.record_drafts(scheduler_stats.spec_decoding_stats)

        def log_engine_initialized(self) -> None:
            pass

    return TableTuneStatLogger


def __getattr__(name: str) -> Any:
    if name == "TableTuneStatLogger":
        from vllm.v1.metrics.loggers import StatLoggerBase

        cls = make_stat_logger_class(StatLoggerBase)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
