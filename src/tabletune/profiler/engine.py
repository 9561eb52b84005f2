"""HTTP to one vLLM server: timed completions, spec-decode counters, k and step cells via the
plugin's admin API (step cells from /metrics on an older plugin), and the sampler switch via the
profiler hook. Retries live here, at the I/O edge, only for
``TemporaryError`` (connection problems, 5xx), on a schedule that is data."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from tabletune.admin.client import AdminClient, AdminRefused, ConditionalPut
from tabletune.admin.protocol import StepCellsRead, TableView
from tabletune.errors import PermanentError, TemporaryError
from tabletune.profiler.errors import HookUnavailable, MeasurementError, NoPluginError
from tabletune.profiler.hook_protocol import HOOK_METHOD, SamplerMode
from tabletune.profiler.metrics import SpecCounters, parse_spec_counters
from tabletune.profiler.prompts import Prompt
from tabletune.profiler.settings import ConnectionSettings
from tabletune.profiler.step_reading import StepReading, parse_step_reading

log = logging.getLogger("tabletune.profiler")
T = TypeVar("T")


@dataclass(frozen=True)
class Completion:
    elapsed_s: float
    completion_tokens: int


class EngineHttp:
    """One server's HTTP surface as the profiler uses it."""

    def __init__(
        self,
        base_url: str,
        *,
        settings: ConnectionSettings,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._settings = settings
        self._clock = clock
        self._sleep = sleep
        self._http = httpx.Client(
            base_url=self.base_url, timeout=settings.request_timeout_s, transport=transport
        )
        self._admin = AdminClient(
            self.base_url,
            token=settings.admin_token,
            timeout_s=min(30.0, settings.request_timeout_s),
            transport=transport,
        )
        self._model: str | None = None
        self._cells_route: bool | None = None  # None: not tried yet
        self._conditional_put: bool | None = None  # None: not tried yet

    def close(self) -> None:
        self._http.close()
        self._admin.close()

    def __enter__(self) -> EngineHttp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- retries -----------------------------------------------------------------------------
    def _retrying(self, what: str, action: Callable[[], T]) -> T:
        backoffs = self._settings.retry_backoffs_s
        attempts = len(backoffs) + 1
        for attempt in range(1, attempts + 1):
            try:
                return action()
            except TemporaryError as error:
                if attempt == attempts:
                    raise TemporaryError(
                        f"{what}: gave up after {attempts} attempts: {error}"
                    ) from None
                delay = backoffs[attempt - 1]
                log.warning(
                    "%s failed (attempt %d/%d): %s; retrying in %.1fs",
                    what,
                    attempt,
                    attempts,
                    error,
                    delay,
                )
                self._sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as error:
            raise TemporaryError(f"{path}: timed out ({type(error).__name__})") from None
        except httpx.HTTPError as error:
            raise TemporaryError(f"{path}: {type(error).__name__}: {error}") from None
        if response.status_code >= 500:
            raise TemporaryError(f"{path}: HTTP {response.status_code}: {response.text[:200]}")
        return response

    # -- server ------------------------------------------------------------------------------
    def healthy(self) -> bool:
        try:
            return self._http.get("/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def model(self) -> str:
        """The served model name (first of /v1/models)."""
        if self._model is None:
            response = self._retrying("GET /v1/models", lambda: self._request("GET", "/v1/models"))
            if response.status_code != 200:
                raise PermanentError(
                    f"/v1/models: HTTP {response.status_code}: {response.text[:200]}"
                )
            data = response.json().get("data") or []
            if not data:
                raise PermanentError("/v1/models lists no model")
            self._model = str(data[0]["id"])
        return self._model

    # -- completions -------------------------------------------------------------------------
    def complete(
        self, prompts: Sequence[Prompt], *, max_tokens: int, temperature: float
    ) -> Completion:
        """One request holding every prompt (vLLM runs them as len(prompts) concurrent
        requests), timed on the injected clock; the server must return every token asked for."""
        body = {
            "model": self.model(),
            "prompt": list(prompts),
            "max_tokens": max_tokens,
            "temperature": temperature,
            "ignore_eos": True,
        }
        expected = len(prompts) * max_tokens

        def attempt() -> Completion:
            start = self._clock()
            response = self._request("POST", "/v1/completions", json=body)
            elapsed = self._clock() - start
            if response.status_code != 200:
                raise PermanentError(
                    f"/v1/completions: HTTP {response.status_code}: {response.text[:300]}"
                )
            tokens = int(response.json().get("usage", {}).get("completion_tokens", -1))
            if tokens != expected:
                raise MeasurementError(
                    f"/v1/completions returned {tokens} tokens for {len(prompts)} prompts x "
                    f"{max_tokens} (expected {expected}): the step arithmetic needs every "
                    "request to run to max_tokens (ignore_eos)"
                )
            return Completion(elapsed_s=elapsed, completion_tokens=tokens)

        return self._retrying(f"completions B={len(prompts)} max_tokens={max_tokens}", attempt)

    # -- counters ----------------------------------------------------------------------------
    def _metrics(self, parse: Callable[[str], T]) -> T:
        def attempt() -> T:
            response = self._request("GET", "/metrics")
            if response.status_code != 200:
                raise PermanentError(f"/metrics: HTTP {response.status_code}")
            return parse(response.text)

        return self._retrying("GET /metrics", attempt)

    def counters(self) -> SpecCounters:
        return self._metrics(parse_spec_counters)

    def step_reading(self) -> StepReading:
        """The engine's step cells: through the admin API's step-cells route, as of the engine's
        last finished step; on a server without it (404: an older plugin), from /metrics from
        then on, as of the plugin's last sync."""
        if self._cells_route is not False:
            try:
                read = self._retrying("GET step cells", self._admin.get_step_cells)
            except AdminRefused as error:
                if error.status != 404:
                    raise
                log.info(
                    "no step-cells route on %s (%s): reading step cells from /metrics, as of "
                    "the plugin's last sync",
                    self.base_url,
                    error.detail,
                )
                self._cells_route = False
            else:
                if self._cells_route is None:
                    log.info("reading step cells through %s's step-cells route", self.base_url)
                self._cells_route = True
                return _reading_of(read)
        return self._metrics(parse_step_reading)

    def switch_k_when_full(
        self, k: int, max_num_seqs: int, *, cell: tuple[int, int], at_least: int
    ) -> tuple[StepReading, bool] | None:
        """Set "k at every batch size" in the engine call that reads the step cells, if the
        cell of ``cell`` (k, batch size) then holds ``at_least`` steps: that reading, and whether
        k was set. None on a server without the condition (an older plugin refuses the field
        with a 422), remembered: the caller reads, then sets k, as before."""
        if self._conditional_put is False:
            return None
        cell_k, batch = cell

        def put() -> ConditionalPut:
            return self._admin.put_table_when(
                [[1, max_num_seqs, k]], k=cell_k, batch_size=batch, at_least=at_least
            )

        try:
            answer = self._retrying(f"PUT table k={k} when cell {cell} has {at_least}", put)
        except AdminRefused as error:
            if error.status != 422 or "when_cell_steps" not in error.detail:
                raise
            log.info(
                "%s takes no conditional table PUT (%s): reading, then setting k",
                self.base_url,
                error.detail,
            )
            self._conditional_put = False
            return None
        self._conditional_put = True
        return _reading_of(answer.step_cells), answer.swapped

    @property
    def readings_fresh(self) -> bool:
        """Whether step readings come through the route (as of the engine's last step)."""
        return self._cells_route is True

    def accepts_text(self) -> bool:
        """Whether the server tokenizes text prompts: one 1-token request, not retried (a server
        started with --skip-tokenizer-init refuses it, with a 4xx or a 5xx)."""
        body = {"model": self.model(), "prompt": "Hello", "max_tokens": 1, "temperature": 0.0}
        try:
            response = self._http.post("/v1/completions", json=body)
        except httpx.HTTPError as error:
            raise TemporaryError(f"text probe: {type(error).__name__}: {error}") from None
        return response.status_code == 200

    # -- the plugin --------------------------------------------------------------------------
    def table(self) -> TableView:
        try:
            return self._retrying("GET table", self._admin.get_table)
        except AdminRefused as error:
            if error.status == 404:
                raise NoPluginError(
                    f"{self.base_url} has no TableTune admin API (404): start vLLM with the "
                    "plugin (VLLM_PLUGINS=tabletune_engine,tabletune_http,tabletune_metrics)"
                ) from None
            raise

    def set_k_everywhere(self, k: int, max_num_seqs: int) -> TableView:
        """The one-range table "k at every batch size"."""
        return self._retrying(
            f"PUT table k={k}", lambda: self._admin.put_table([[1, max_num_seqs, k]])
        )

    def set_table(self, ranges: Sequence[Sequence[int]]) -> TableView:
        return self._retrying("PUT table", lambda: self._admin.put_table(ranges))

    # -- the profiler hook -------------------------------------------------------------------
    def set_sampler(self, mode: SamplerMode) -> dict[str, Any]:
        """Switch the rejection sampler at run time (needs the hook and VLLM_SERVER_DEV_MODE=1)."""
        payload = {"method": HOOK_METHOD, "args": [json.dumps(mode.to_json())]}

        def attempt() -> httpx.Response:
            try:
                return self._http.post("/collective_rpc", json=payload)
            except httpx.HTTPError as error:
                raise TemporaryError(f"/collective_rpc: {type(error).__name__}: {error}") from None

        response = self._retrying("sampler switch", attempt)
        if response.status_code != 200:
            raise HookUnavailable(
                f"sampler switch refused (HTTP {response.status_code}: {response.text[:200]}); "
                "it needs VLLM_SERVER_DEV_MODE=1 and the tabletune_profiler general plugin"
            )
        results = response.json().get("results") or []
        if not results or not isinstance(results[0], dict):
            raise HookUnavailable(f"sampler switch: unexpected answer {response.text[:200]}")
        return dict(results[0])


def _reading_of(read: StepCellsRead) -> StepReading:
    return StepReading(read.cells, read.steps_without_decode, read.switch_steps)
