"""The Prometheus source: each replica's exact counter increases over ``(last evaluation, now]``.

Windows are adjacent and counted from Prometheus's raw samples (``windows``): the value at the
window's last scrape minus the value at the scrape before it starts, across restarts; nothing
is extrapolated. A window Prometheus cannot vouch for (it was down or restarted empty, the
target is new, the last scrape failed) is refused for that replica: a problem, no observation.

One cycle makes at most five queries whatever the number of replicas, each over every replica
at once: (1) the raw ``up`` and start-time samples of every target (a few series per target),
which decide each window (``windows.judge``); (2) for the windows without a restart, the
replicas whose counters went back anyway; (3) for the others, the difference of every counter
between the window's two scrapes, computed by Prometheus, non-zero rows only (exactly the raw
rule when there is no restart between them); (4) only for replicas with a restart (or not
counted from their last scrape), their counters' raw samples, counted in Python; (5) the mean
running-requests gauge. Replicas are the values of one target label (``instance`` by default).
Any failed query is an outage for the whole cycle: no push.
"""

from __future__ import annotations

import base64
import math
import ssl
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import httpx

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
from tabletune.daemon.settings import SourceSettings, mask_credentials
from tabletune.errors import InputError, TemporaryError

UP = "up"
PARALLEL_QUERIES = 8
SERVER_TIMEOUT = "20s"


class QueryApi(Protocol):
    """An instant query: the ``result`` list of Prometheus's answer (vector or matrix)."""

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any: ...


def _secret_file(path: Path, variable: str) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise InputError(f"{variable}: cannot read {path}: {error.strerror}") from None


class PrometheusAuth(httpx.Auth):
    """Basic or bearer credentials from the settings; secret files are read on each request,
    so a rotated token (a Kubernetes service-account token) is picked up without a restart."""

    def __init__(self, settings: SourceSettings) -> None:
        self._settings = settings
        self.header()  # an unreadable file stops the daemon at start, naming its variable

    def header(self) -> str | None:
        s = self._settings
        if s.prometheus_bearer_token is not None:
            return f"Bearer {s.prometheus_bearer_token.get_secret_value()}"
        if s.prometheus_bearer_token_file is not None:
            token = _secret_file(
                s.prometheus_bearer_token_file, "TABLETUNE_SOURCE__PROMETHEUS_BEARER_TOKEN_FILE"
            )
            return f"Bearer {token}"
        if s.prometheus_username is None:
            return None
        if s.prometheus_password_file is not None:
            password = _secret_file(
                s.prometheus_password_file, "TABLETUNE_SOURCE__PROMETHEUS_PASSWORD_FILE"
            )
        elif s.prometheus_password is not None:
            password = s.prometheus_password.get_secret_value()
        else:
            password = ""
        pair = f"{s.prometheus_username}:{password}".encode()
        return f"Basic {base64.b64encode(pair).decode('ascii')}"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        header = self.header()
        if header is not None:
            request.headers["Authorization"] = header
        yield request


def tls_verify(settings: SourceSettings) -> ssl.SSLContext | bool:
    """Verify Prometheus's certificate (against the CA file when given) unless turned off."""
    if not settings.prometheus_tls_verify:
        return False
    if settings.prometheus_ca_file is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(settings.prometheus_ca_file))
    except (OSError, ssl.SSLError) as error:
        raise InputError(
            f"TABLETUNE_SOURCE__PROMETHEUS_CA_FILE: cannot load {settings.prometheus_ca_file}: "
            f"{error}"
        ) from None


class PrometheusHttp:
    """Prometheus's query API over httpx: POST (long replica lists fit), TLS verified,
    credentials from the settings or the URL, never shown in an error."""

    def __init__(
        self, settings: SourceSettings, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        assert settings.prometheus_url is not None
        url = httpx.URL(settings.prometheus_url)
        auth: httpx.Auth = PrometheusAuth(settings)
        if url.username:  # credentials in the URL: used as basic auth, kept out of messages
            auth = httpx.BasicAuth(url.username, url.password)
            url = url.copy_with(username=None, password=None)
        self._url = str(url).rstrip("/") + "/api/v1/query"
        self._http = httpx.Client(
            timeout=settings.timeout_s, auth=auth, verify=tls_verify(settings), transport=transport
        )

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        try:
            response = self._http.post(self._url, data={"query": query, **(params or {})})
        except httpx.HTTPError as error:
            raise TemporaryError(f"{self._url}: {type(error).__name__}: {error}") from None
        if response.status_code != 200:
            raise TemporaryError(f"{self._url}: HTTP {response.status_code}: {response.text[:200]}")
        body = response.json()
        if body.get("status") != "success":
            raise TemporaryError(f"{self._url}: {body.get('error', body)!s:.200}")
        return body["data"]["result"]

    def close(self) -> None:
        self._http.close()


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
        and the replicas that restarted in their window (seen in their counters)."""
        if not counted:
            return {}, {}, set()
        by = (self._label, *KEY_LABELS)
        clean = {r for r, w in counted.items() if w.clean}
        exprs = [exact_differences(names_selector((name,)), window_s, by) for name in COUNTERS]
        exprs.append(
            f"sum by ({self._label}) "
            f"(avg_over_time({names_selector((RUNNING,))}[{_duration(window_s)}]))"
        )
        # Without a start time read at both ends, only the counters can show a restart.
        unvouched = [counted[r].base for r in clean if not counted[r].starts_vouch]
        if unvouched:
            earliest = min(base for base in unvouched if base is not None)
            exprs.append(any_went_back(COUNTERS, _back_to(earliest, at), self._label))
        results = self._query_all(exprs, at)
        increases: dict[str, dict[CounterKey, float]] = {}
        restarted: set[str] = set()
        for name, rows in zip(COUNTERS, results, strict=False):
            for row in rows:
                replica = self._replica(row["metric"])
                if replica not in clean:
                    continue
                value = float(row["value"][1])
                if value < 0:
                    restarted.add(replica)
                increases.setdefault(replica, {})[counter_key(name, row["metric"])] = value
        running = {
            replica: value
            for row in results[len(COUNTERS)]
            if (replica := self._replica(row["metric"])) is not None
            and not math.isnan(value := float(row["value"][1]))
        }
        if unvouched:
            restarted |= {r for row in results[-1] if (r := self._replica(row["metric"]))}
        raw = {r: w for r, w in counted.items() if r not in clean or r in restarted}
        if raw:
            increases.update(self._raw_increases(raw, at, at - window_s, restarted))
        return increases, running, restarted

    def _raw_increases(
        self, raw: Mapping[str, windows.TargetWindow], at: float, since: float, restarted: set[str]
    ) -> dict[str, dict[CounterKey, float]]:
        """Query (4): the counters of the replicas in ``raw`` (window from ``since`` to
        ``at``), from their raw samples; adds those whose counters went back to ``restarted``."""
        since = min(w.base if w.base is not None else since for w in raw.values())
        names = "|".join(_promql_regex(r) for r in sorted(raw))
        exprs = [
            f"{names_selector((name,), **{self._label: names})}[{_back_to(since, at)}]"
            for name in COUNTERS
        ]
        out: dict[str, dict[CounterKey, float]] = {replica: {} for replica in raw}
        for name, rows in zip(COUNTERS, self._query_all(exprs, at), strict=True):
            for row in rows:
                replica = self._replica(row["metric"])
                if replica is None or replica not in raw:
                    continue
                value, went_back = windows.series_increase(_samples(row), raw[replica])
                key = counter_key(name, row["metric"])
                out[replica][key] = out[replica].get(key, 0.0) + value
                if went_back:
                    restarted.add(replica)
        return out


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
