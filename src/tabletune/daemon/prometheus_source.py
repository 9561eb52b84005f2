"""The Prometheus source: counter increases over exactly the interval since the last evaluation.

Consecutive evaluations use adjacent windows ``(last, now]`` and value differences at their
edges, so nothing is counted twice or skipped; ``increase()`` covers windows with a counter
reset, and ``resets()`` tells the controller a replica restarted. Replicas are the values of
one series label (``instance`` by default), optionally filtered by a static list. Any query
failure is an outage for the whole cycle: no push.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol

from tabletune import metric_names as mn
from tabletune.daemon.observation import Observation, SourceResult
from tabletune.daemon.scrape import buckets_to_ranges
from tabletune.daemon.settings import SourceSettings
from tabletune.errors import TemporaryError


class QueryApi(Protocol):
    """What we use of ``prometheus_api_client.PrometheusConnect``."""

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any: ...


def connect(settings: SourceSettings) -> QueryApi:
    from prometheus_api_client import PrometheusConnect

    assert settings.prometheus_url is not None
    client: QueryApi = PrometheusConnect(url=settings.prometheus_url, disable_ssl=True)
    return client


def series(name: str) -> str:
    """A selector for ``name`` as scraped: prometheus_client's OpenMetrics output (what
    Prometheus asks for) spells vLLM's ``vllm:`` names as ``vllm_``; match both."""
    if ":" not in name:
        return name
    return f'{{__name__=~"{name}|{name.replace(":", "_")}"}}'


def counter_delta(selector: str, window: str) -> str:
    """PromQL for a counter's increase over exactly ``(now - window, now]``, per series.

    Without a reset it is the value now minus the value at the window's start, so adjacent
    windows add up exactly (``increase()`` alone extrapolates to the edges and can lose the
    step between two windows). A series that reset in the window uses ``increase()``, which
    handles resets; one that went back without a reset sample in the window (the engine was
    down across the edge) or did not exist at the start counts from zero.
    """
    x = selector
    difference = f"({x} - {x} offset {window})"
    reset = f"(resets({x}[{window}]) > 0)"
    return f"(({difference} >= 0) unless {reset}) or (increase({x}[{window}]) and {reset}) or {x}"


def counter_went_back(selector: str, window: str) -> str:
    """Series whose counter reset in the window (the engine restarted)."""
    x = selector
    return f"((resets({x}[{window}]) > 0) or (({x} - {x} offset {window}) < 0))"


def _window(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


class PrometheusSource:
    """Queries one Prometheus for every replica's counter increases."""

    def __init__(
        self,
        *,
        settings: SourceSettings,
        api: QueryApi | None = None,
        last_evaluation: float | None = None,
        default_window_s: float = 15.0,
    ) -> None:
        self._settings = settings
        self._api = api if api is not None else connect(settings)
        self._label = settings.replica_label
        self._keep = set(settings.replicas)
        self.last_evaluation = last_evaluation
        self._default_window_s = default_window_s
        self._known: set[str] = set()

    def _query(self, expr: str, at: float) -> list[dict[str, Any]]:
        try:
            result = self._api.custom_query(expr, params={"time": at, "timeout": "20s"})
        except Exception as error:  # the client raises requests/its own errors: wrap them all
            raise TemporaryError(
                f"Prometheus query failed: {type(error).__name__}: {error}"
            ) from None
        if not isinstance(result, list):
            raise TemporaryError(f"Prometheus answered {type(result).__name__}, not a vector")
        return result

    def _by(self, expr: str, at: float, *labels: str) -> dict[tuple[str, ...], float]:
        out: dict[tuple[str, ...], float] = {}
        for row in self._query(expr, at):
            metric = row.get("metric", {})
            replica = metric.get(self._label)
            if replica is None or (self._keep and replica not in self._keep):
                continue
            value = float(row["value"][1])
            if math.isnan(value):
                continue
            out[(replica, *(metric.get(label, "") for label in labels))] = value
        return out

    def collect(self, now: float, *, on_replica: Callable[[], bool] | None = None) -> SourceResult:
        at = now - self._settings.query_delay_s
        since = self.last_evaluation
        if since is None or since >= at:
            since = at - self._default_window_s
        window_s = min(at - since, self._settings.max_window_s)
        w = _window(window_s)
        label = self._label
        drafts_total = series(f"{mn.VLLM_NUM_DRAFTS}_total")
        accepted_total = series(f"{mn.VLLM_ACCEPTED_PER_POS}_total")
        tokens_total = series(f"{mn.VLLM_GENERATION_TOKENS}_total")
        running_now = series(mn.VLLM_NUM_REQUESTS_RUNNING)
        fresh = self._by(
            f"max by ({label}, {mn.LABEL_MODEL}) (timestamp({drafts_total}))",
            at,
            mn.LABEL_MODEL,
        )

        def increase(selector: str, *by: str) -> dict[tuple[str, ...], float]:
            group = ", ".join((label, *by))
            return self._by(f"sum by ({group}) ({counter_delta(selector, w)})", at, *by)

        drafted = increase(f"{mn.TT_DRAFT_TOKENS_PER_POS}_total", mn.LABEL_POSITION)
        accepted = increase(accepted_total, mn.LABEL_POSITION)
        tokens = increase(tokens_total)
        buckets = increase(f"{mn.TT_DECODE_BATCH_SIZE}_bucket", "le")
        batch_sum = increase(f"{mn.TT_DECODE_BATCH_SIZE}_sum")
        batch_count = increase(f"{mn.TT_DECODE_BATCH_SIZE}_count")
        running = self._by(f"sum by ({label}) (avg_over_time({running_now}[{w}]))", at)
        step_sum = increase(f"{mn.TT_STEP_DURATION}_sum", mn.LABEL_K, mn.LABEL_BATCH_BUCKET)
        step_count = increase(f"{mn.TT_STEP_DURATION}_count", mn.LABEL_K, mn.LABEL_BATCH_BUCKET)
        resets = self._by(f"count by ({label}) {counter_went_back(drafts_total, w)}", at)
        self.last_evaluation = at

        observations: dict[str, Observation] = {}
        problems: dict[str, str] = {}
        seen: dict[str, tuple[float, str]] = {}
        for (replica, model), timestamp in fresh.items():
            seen[replica] = (timestamp, model)
        for replica in sorted(self._known - set(seen)):
            problems[replica] = "no series in Prometheus (target down or gone)"
        for replica, (timestamp, model) in sorted(seen.items()):
            if on_replica is not None and not on_replica():
                break
            self._known.add(replica)
            age = at - timestamp
            if age > self._settings.stale_after_s:
                problems[replica] = f"last sample {age:.0f} s old"
                continue
            observations[replica] = Observation(
                replica=replica,
                admin_url=self._settings.admin_url_template.format(replica=replica),
                interval_s=window_s,
                drafted=_per_position(drafted, replica),
                accepted=_per_position(accepted, replica),
                load_buckets=buckets_to_ranges(_cumulative(buckets, replica)),
                mean_batch=_mean(batch_sum, batch_count, running, replica),
                generated_tokens=tokens.get((replica,), 0.0),
                step_times=_steps(step_sum, step_count, replica),
                reset=resets.get((replica,), 0.0) > 0,
                model_name=model or None,
            )
        return SourceResult(observations=observations, problems=problems)


def _per_position(values: dict[tuple[str, ...], float], replica: str) -> tuple[float, ...]:
    by_position = {
        int(key[1]): v for key, v in values.items() if key[0] == replica and key[1].isdigit()
    }
    size = max(by_position, default=-1) + 1
    return tuple(max(0.0, by_position.get(p, 0.0)) for p in range(size))


def _cumulative(values: dict[tuple[str, ...], float], replica: str) -> dict[float, float]:
    return {float(key[1]): v for key, v in values.items() if key[0] == replica}


def _mean(
    total: dict[tuple[str, ...], float],
    count: dict[tuple[str, ...], float],
    running: dict[tuple[str, ...], float],
    replica: str,
) -> float | None:
    n = count.get((replica,), 0.0)
    if n > 0:
        return total.get((replica,), 0.0) / n
    return running.get((replica,))


def _steps(
    total: dict[tuple[str, ...], float], count: dict[tuple[str, ...], float], replica: str
) -> dict[tuple[int, str], tuple[float, float]]:
    out: dict[tuple[int, str], tuple[float, float]] = defaultdict(lambda: (0.0, 0.0))
    for key, n in count.items():
        if key[0] != replica or not key[1].isdigit() or n <= 0:
            continue
        out[(int(key[1]), key[2])] = (total.get(key, 0.0), n)
    return dict(out)
