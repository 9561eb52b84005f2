"""The Prometheus source: each replica's exact counter increases over ``(last evaluation, now]``.

Windows are adjacent and counted from Prometheus's raw samples (``windows``): the value at the
window's last successful scrape minus the value at the last successful scrape before it,
across restarts; nothing is extrapolated. A window Prometheus cannot vouch for (it was down or
restarted empty, the target is new or down) is refused for that replica: a problem with its
reason, no observation.

Every query covers every replica at once (per counter family, never per replica) and those of
one step run together, so a cycle makes the same few queries for 1 or 1,000 replicas: (1) the
raw ``up`` and start-time samples of every target (a few series per target), which decide each
window (``windows.judge``); (2) per family, the difference of every counter between the
window's two scrapes, computed by Prometheus, non-zero rows only, used where no restart can be
between them (exactly the raw rule there); the running-requests mean; for windows no start
time vouches for, the replicas whose counters went back; (3) only for replicas with a restart
or a window not between the last scrapes, per family, their counters' raw samples, counted in
Python. Replicas are the values of one target label (``instance`` by default). Any failed query
is an outage for the whole cycle: no push.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tabletune.daemon import windows
from tabletune.daemon.counters import (
    COUNTERS,
    GENERATED,
    KEY_LABELS,
    RUNNING,
    START_SERIES,
    CounterKey,
    both_spellings,
    canonical_name,
    counter_key,
    observation_from,
)
from tabletune.daemon.observation import Observation, SourceResult
from tabletune.daemon.prometheus_http import PrometheusHttp, QueryApi
from tabletune.daemon.settings import SourceSettings, mask_credentials
from tabletune.errors import TemporaryError

UP = "up"
PARALLEL_QUERIES = 8
SERVER_TIMEOUT = "20s"


def names_selector(names: Iterable[str], **matchers: str) -> str:
    """``{__name__=~"a|b", label=~`x|y`}``: every name in both of vLLM's spellings."""
    spelled = sorted({n for name in names for n in both_spellings(name)})
    parts = [f'__name__=~"{"|".join(spelled)}"', *(f"{k}=~`{v}`" for k, v in matchers.items())]
    return "{" + ", ".join(parts) + "}"


def _duration(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds * 1000))}ms"


def _back_to(timestamp: float, at: float) -> str:
    """A range reaching from ``at`` back to a sample at ``timestamp`` (ranges exclude their
    start in Prometheus 3, include it in 2: one extra millisecond serves both)."""
    return _duration(at - timestamp + windows.SAME_SCRAPE_S)


def exact_differences(selector: str, offset_s: float, by: Iterable[str]) -> str:
    """PromQL: per group, each series' value now minus its value ``offset_s`` earlier (a
    series absent then counts from zero), non-zero sums only. Exact when no restart is between
    the two samples and the earlier one is the scrape the window counts from, which
    succeeded, so a series it lacked is new (the caller checks all three)."""
    then = f"{selector} offset {_duration(offset_s)}"
    return f"sum by ({', '.join(by)}) (({selector} - {then}) or {selector}) != 0"


def any_went_back(names: Iterable[str], range_: str, label: str) -> str:
    """PromQL: the values of ``label`` having a counter of ``names`` that went back within
    ``range_`` (one ``resets`` per name: the function drops names, which would collide)."""
    each = " or ".join(f"(resets({names_selector((name,))}[{range_}]) > 0)" for name in names)
    return f"count by ({label}) ({each})"


def _samples(row: Mapping[str, Any]) -> list[windows.Sample]:
    out = [(float(ts), float(value)) for ts, value in row.get("values", ())]
    return [s for s in out if not math.isnan(s[1])]


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
        self._owned: PrometheusHttp | None = None
        if api is None:
            api = self._owned = PrometheusHttp(settings)
        self._api = api
        self._label = settings.replica_label
        self._keep = set(settings.replicas)
        self.last_evaluation = last_evaluation
        self._default_window_s = default_window_s
        self._known: set[str] = set()

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()

    def forget(self, replica: str) -> None:
        """Stop naming the replica when Prometheus no longer has it (it comes back on its own
        when its target does)."""
        self._known.discard(replica)

    def _query(self, expr: str, at: float) -> list[dict[str, Any]]:
        try:
            result = self._api.custom_query(expr, params={"time": at, "timeout": SERVER_TIMEOUT})
        except Exception as error:  # any client failure is an outage of this cycle
            message = mask_credentials(f"{type(error).__name__}: {error}")
            raise TemporaryError(f"Prometheus query failed: {message}") from None
        if not isinstance(result, list):
            raise TemporaryError(f"Prometheus answered {type(result).__name__}, not a vector")
        return result

    def _replica(self, metric: Mapping[str, str]) -> str | None:
        replica = metric.get(self._label)
        if replica is None or (self._keep and replica not in self._keep):
            return None
        return replica

    def _query_all(self, exprs: Sequence[str], at: float) -> list[list[dict[str, Any]]]:
        """The queries at once: Prometheus runs them on several cores."""
        with ThreadPoolExecutor(max_workers=min(len(exprs), PARALLEL_QUERIES)) as pool:
            return list(pool.map(lambda expr: self._query(expr, at), exprs))

    def collect(self, now: float, *, on_replica: Callable[[], bool] | None = None) -> SourceResult:
        at = now - self._settings.query_delay_s
        since = self.last_evaluation
        if since is None or since >= at:
            since = at - self._default_window_s
        window_s = min(at - since, self._settings.max_window_s)
        since = at - window_s
        targets = self._targets(at, window_s + self._settings.stale_after_s)
        problems: dict[str, str] = {}
        counted: dict[str, windows.TargetWindow] = {}
        for replica in sorted(set(targets) | self._known):
            target = targets.get(replica)
            if target is None:
                problems[replica] = "no samples in Prometheus (target removed, or no data)"
                continue
            verdict = target.judge(since=since, at=at)
            if isinstance(verdict, windows.Refused):
                problems[replica] = verdict.reason
            else:
                counted[replica] = verdict
        increases, running, restarted = self._increases(counted, at, window_s)
        self.last_evaluation = at
        self._known |= set(targets)

        observations: dict[str, Observation] = {}
        for replica, window in sorted(counted.items()):
            if on_replica is not None and not on_replica():
                break
            observations[replica] = observation_from(
                increases.get(replica, {}),
                replica=replica,
                admin_url=self._settings.admin_url_template.format(replica=replica),
                interval_s=window_s,
                running=running.get(replica),
                reset=window.reset or replica in restarted,
                model_name=targets[replica].model_name,
            )
        return SourceResult(observations=observations, problems=problems)

    def _targets(self, at: float, range_s: float) -> dict[str, _Target]:
        """Query (1): every target's raw ``up``, start-time and generated-token samples."""
        selector = names_selector((UP, *START_SERIES, GENERATED))
        out: dict[str, _Target] = {}
        for row in self._query(f"{selector}[{_duration(range_s)}]", at):
            metric = row.get("metric", {})
            replica = self._replica(metric)
            if replica is not None:
                out.setdefault(replica, _Target()).add(canonical_name(metric["__name__"]), row)
        return {replica: t for replica, t in out.items() if t.is_vllm or replica in self._known}

    def _increases(
        self, counted: Mapping[str, windows.TargetWindow], at: float, window_s: float
    ) -> tuple[dict[str, dict[CounterKey, float]], dict[str, float], set[str]]:
        """Each counted replica's increases per counter series, its mean running requests,
        and the replicas whose counters went back inside their window (they restarted)."""
        if not counted:
            return {}, {}, set()
        by = (self._label, *KEY_LABELS)
        clean = {r for r, w in counted.items() if w.clean}
        exprs = [exact_differences(names_selector((name,)), window_s, by) for name in COUNTERS]
        exprs.append(
            f"sum by ({self._label}) "
            f"(avg_over_time({names_selector((RUNNING,))}[{_duration(window_s)}]))"
        )
        # Without a start time read at both ends, only the counters can show a restart. The
        # scan may reach before a window's base: a hit only sends the replica to the raw count.
        unvouched = [w.base for r, w in counted.items() if r in clean and not w.starts_vouch]
        if unvouched:
            earliest = min(base for base in unvouched if base is not None)
            exprs.append(any_went_back(COUNTERS, _back_to(earliest, at), self._label))
        results = self._query_all(exprs, at)
        increases: dict[str, dict[CounterKey, float]] = {}
        suspect: set[str] = set()
        for name, rows in zip(COUNTERS, results, strict=False):
            for row in rows:
                replica = self._replica(row["metric"])
                if replica is None or replica not in clean:
                    continue
                value = float(row["value"][1])
                if value < 0:
                    suspect.add(replica)
                increases.setdefault(replica, {})[counter_key(name, row["metric"])] = value
        running = {
            replica: value
            for row in results[len(COUNTERS)]
            if (replica := self._replica(row["metric"])) is not None
            and not math.isnan(value := float(row["value"][1]))
        }
        if unvouched:
            suspect |= {r for row in results[-1] if (r := self._replica(row["metric"]))}
        raw = {r: w for r, w in counted.items() if r not in clean or r in suspect}
        restarted: set[str] = set()
        if raw:
            counts, restarted = self._raw_increases(raw, at, at - window_s)
            increases.update(counts)
        return increases, running, restarted

    def _raw_increases(
        self, raw: Mapping[str, windows.TargetWindow], at: float, since: float
    ) -> tuple[dict[str, dict[CounterKey, float]], set[str]]:
        """The counters of the replicas in ``raw`` (window ``(since, at]``) from their raw
        samples; and those whose counters went back."""
        since = min(w.base if w.base is not None else since for w in raw.values())
        names = "|".join(_promql_regex(r) for r in sorted(raw))
        exprs = [
            f"{names_selector((name,), **{self._label: names})}[{_back_to(since, at)}]"
            for name in COUNTERS
        ]
        out: dict[str, dict[CounterKey, float]] = {replica: {} for replica in raw}
        went_back: set[str] = set()
        for name, rows in zip(COUNTERS, self._query_all(exprs, at), strict=True):
            for row in rows:
                replica = self._replica(row["metric"])
                if replica is None or replica not in raw:
                    continue
                value, back = windows.series_increase(_samples(row), raw[replica])
                key = counter_key(name, row["metric"])
                out[replica][key] = out[replica].get(key, 0.0) + value
                if back:
                    went_back.add(replica)
        return out, went_back


def _promql_regex(value: str) -> str:
    """``value`` as an exact RE2 pattern inside a PromQL raw string (backticks)."""
    return "".join(c if c.isalnum() or c == "_" else f"\\{c}" for c in value)


class _Target:
    """One target's raw samples from query (1)."""

    def __init__(self) -> None:
        self.up: list[list[windows.Sample]] = []
        self.starts: list[list[windows.Sample]] = []
        self.is_vllm = False
        self.model_name: str | None = None

    def add(self, name: str, row: Mapping[str, Any]) -> None:
        if name == UP:
            self.up.append(_samples(row))
        elif name == GENERATED:
            self.is_vllm = True
            self.model_name = row["metric"].get("model_name", self.model_name)
        else:
            self.starts.append(_samples(row))

    def judge(self, *, since: float, at: float) -> windows.TargetWindow | windows.Refused:
        if len(self.up) != 1:
            return windows.Refused(
                f"{len(self.up)} Prometheus targets carry this replica's label; need exactly one"
            )
        return windows.judge(self.up[0], self.starts, since=since, at=at)
