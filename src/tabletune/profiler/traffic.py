"""Requests kept running in the background while the profiler reads step cells.

One event loop on its own thread holds every completion request open; ``stop_all`` cancels
them, which closes their connections, and vLLM aborts a request whose client went away
(``with_cancellation`` on its completion route). An optional prefill stream sends one-token
requests at Poisson arrivals: each only prefills, riding along with the decode steps.
The caller stays synchronous.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol

import httpx

from tabletune.profiler.prompts import Prompt
from tabletune.schemas.shape import PrefillStream

log = logging.getLogger("tabletune.profiler")


class Traffic(Protocol):
    """What the in-flight measurer needs of the requests it keeps running."""

    def send(self, prompts: Sequence[Prompt], *, max_tokens: int) -> None:
        """Start ``len(prompts)`` requests (one completion request) and return at once."""

    def stop_all(self) -> None:
        """Abort every request still running (returns once they are cancelled here)."""

    def failures(self) -> list[str]:
        """Errors of requests that ended badly since the last call (empty: none)."""

    def start_stream(self, stream: PrefillStream) -> None: ...

    def stop_stream(self) -> None: ...

    def close(self) -> None: ...


class BackgroundTraffic:
    """``Traffic`` over HTTP to one vLLM server."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        temperature: float,
        timeout_s: float,
        token_low: int,
        token_high: int,
        seed: int,
    ) -> None:
        self._model = model
        self._temperature = temperature
        self._token_range = (token_low, token_high)
        self._random = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tabletune-traffic", daemon=True
        )
        self._thread.start()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        self._http = self._run(self._client(base_url, timeout_s, limits))
        self._requests: list[concurrent.futures.Future[None]] = []
        self._stream: concurrent.futures.Future[None] | None = None
        self._errors: list[str] = []
        self._lock = threading.Lock()

    @staticmethod
    async def _client(base_url: str, timeout_s: float, limits: httpx.Limits) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=base_url, timeout=timeout_s, limits=limits)

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    async def _post(self, prompts: list[Prompt], max_tokens: int) -> None:
        body = {
            "model": self._model,
            "prompt": prompts,
            "max_tokens": max_tokens,
            "temperature": self._temperature,
            "ignore_eos": True,
        }
        try:
            response = await self._http.post("/v1/completions", json=body)
        except httpx.HTTPError as error:
            self._failed(f"{len(prompts)} requests: {type(error).__name__}: {error}")
            return
        if response.status_code != 200:
            self._failed(
                f"{len(prompts)} requests: HTTP {response.status_code}: {response.text[:200]}"
            )

    def _failed(self, message: str) -> None:
        with self._lock:
            self._errors.append(message)

    def send(self, prompts: Sequence[Prompt], *, max_tokens: int) -> None:
        self._requests = [f for f in self._requests if not f.done()]
        self._requests.append(self._spawn(self._post(list(prompts), max_tokens)))

    def stop_all(self) -> None:
        for future in self._requests:
            future.cancel()
        concurrent.futures.wait(self._requests, timeout=30)
        self._requests = []

    def failures(self) -> list[str]:
        with self._lock:
            errors, self._errors = self._errors, []
        return errors

    def _prompt(self, length: int) -> list[int]:
        low, high = self._token_range
        return [self._random.randrange(low, high) for _ in range(length)]

    async def _arrivals(self, stream: PrefillStream) -> None:
        pending: set[asyncio.Task[None]] = set()
        rng = random.Random(self._random.random())
        try:
            while True:
                await asyncio.sleep(rng.expovariate(stream.requests_per_s))
                length = rng.randint(*stream.prompt_tokens)
                task = asyncio.create_task(self._post([self._prompt(length)], 1))
                pending.add(task)
                task.add_done_callback(pending.discard)
        finally:
            for task in pending:
                task.cancel()

    def start_stream(self, stream: PrefillStream) -> None:
        self.stop_stream()
        self._stream = self._spawn(self._arrivals(stream))

    def stop_stream(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            concurrent.futures.wait([self._stream], timeout=30)
            self._stream = None

    def close(self) -> None:
        self.stop_stream()
        self.stop_all()
        self._run(self._http.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
