"""Traffic for the GPU jobs (live_step_time.py, live_daemon.py): named shapes of request lengths,
and a closed loop of clients sending requests drawn from one.

A shape draws each request's prompt and output lengths; the request is random token ids (dummy
weights: the content does not matter) with ``ignore_eos``, so it runs to its drawn length.

  decode-heavy  prompts 16-96 tokens, outputs 300-700 (uniform): the live step-time job's
  chat-like     prompts lognormal around 600 tokens (32-3,000), outputs around 250 (16-1,000)
  long-context  prompts 2,000-4,000 tokens, outputs 100-300 (uniform)

Two rules on top of the draw:
- A client's first request starts part-way: a random part of its drawn output is already in the
  prompt, so the clients' contexts and end times are spread from the start (steady load).
- Prompt + output never exceed the engine's ``max_model_len``: a draw over it keeps its prompt
  (cut only as far as leaves the shape's shortest output) and loses the end of its output. A
  shape whose shortest prompt and output do not fit at all is refused (ValueError).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

Row = dict[str, Any]


@dataclass(frozen=True)
class Uniform:
    """Token counts drawn uniformly from ``low..high`` (inclusive)."""

    low: int
    high: int

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)

    def describe(self) -> tuple[int, int]:
        return (self.low, self.high)


@dataclass(frozen=True)
class LogNormal:
    """Token counts lognormal around ``median`` (``sigma``: of the log), rounded and clipped
    into ``low..high`` (clipping keeps the rng's use one call per draw, the median unchanged)."""

    median: float
    sigma: float
    low: int
    high: int

    def draw(self, rng: random.Random) -> int:
        drawn = round(rng.lognormvariate(math.log(self.median), self.sigma))
        return min(self.high, max(self.low, drawn))

    def describe(self) -> Row:
        return {"lognormal": {"median": self.median, "sigma": self.sigma},
                "bounds": (self.low, self.high)}  # fmt: skip


@dataclass(frozen=True)
class TrafficShape:
    """A named kind of traffic: the distributions of prompt and output lengths (tokens)."""

    name: str
    prompt: Uniform | LogNormal
    output: Uniform | LogNormal

    def __post_init__(self) -> None:
        for part in (self.prompt, self.output):
            if not 1 <= part.low <= part.high:
                raise ValueError(f"traffic shape {self.name}: bounds {part.low}..{part.high}")

    def check_fits(self, max_model_len: int) -> None:
        """Refuse an engine whose context cannot hold the shortest request of this shape."""
        shortest = self.prompt.low + self.output.low
        if shortest > max_model_len:
            raise ValueError(f"traffic shape {self.name} needs max_model_len >= {shortest} "
                             f"(got {max_model_len})")  # fmt: skip

    def describe(self) -> Row:
        """The lengths as the jobs' results record them (meta "lengths")."""
        return {"prompt": self.prompt.describe(), "output": self.output.describe()}


DECODE_HEAVY = TrafficShape("decode-heavy", prompt=Uniform(16, 96), output=Uniform(300, 700))
CHAT_LIKE = TrafficShape(
    "chat-like",
    prompt=LogNormal(median=600, sigma=0.6, low=32, high=3000),
    output=LogNormal(median=250, sigma=0.5, low=16, high=1000),
)
LONG_CONTEXT = TrafficShape("long-context", prompt=Uniform(2000, 4000), output=Uniform(100, 300))
SHAPES = {shape.name: shape for shape in (DECODE_HEAVY, CHAT_LIKE, LONG_CONTEXT)}


def add_traffic_arguments(
    parser: argparse.ArgumentParser, *, default_shape: str = DECODE_HEAVY.name
) -> None:
    """The drivers' traffic options: ``--shape`` (default ``default_shape``) and the engine's
    ``--max-model-len`` (live_step_time.sh launches vLLM with 4096)."""
    parser.add_argument("--shape", choices=sorted(SHAPES), default=default_shape,
                        help="request lengths (bench/gpu/traffic.py)")  # fmt: skip
    parser.add_argument("--max-model-len", type=int, default=4096,
                        help="the engine's; prompt + output never exceed it")  # fmt: skip


def checked_shape(parser: argparse.ArgumentParser, args: argparse.Namespace) -> TrafficShape:
    """The shape ``args`` name, or the parser's one-line error if it cannot fit the engine."""
    shape = SHAPES[args.shape]
    try:
        shape.check_fits(args.max_model_len)
    except ValueError as error:
        parser.error(str(error))
    return shape


def draw_lengths(
    rng: random.Random, shape: TrafficShape, *, max_model_len: int, first: bool = False
) -> tuple[int, int]:
    """(prompt tokens, output tokens) of one request: drawn from ``shape``, fitted into
    ``max_model_len``, and for a client's ``first`` request started part-way through."""
    shape.check_fits(max_model_len)
    prompt = shape.prompt.draw(rng)
    output = shape.output.draw(rng)
    prompt = min(prompt, max_model_len - shape.output.low)
    output = min(output, max_model_len - prompt)
    if first:
        done = rng.randint(0, output - 1)
        prompt, output = prompt + done, output - done
    return prompt, output


def request_body(
    rng: random.Random, model: str, shape: TrafficShape, *, max_model_len: int, first: bool
) -> Row:
    """One completion request of token ids, its lengths from :func:`draw_lengths`."""
    prompt, output = draw_lengths(rng, shape, max_model_len=max_model_len, first=first)
    return {
        "model": model,
        "prompt": [rng.randrange(1000, 30000) for _ in range(prompt)],
        "max_tokens": output,
        "ignore_eos": True,
        "temperature": 0.0,
    }


def client_requests(
    seed: int, index: int, model: str, shape: TrafficShape, *, max_model_len: int
) -> Iterator[Row]:
    """The requests client ``index`` of a closed loop seeded ``seed`` sends, in order."""
    rng = random.Random(seed * 100_003 + index)
    yield request_body(rng, model, shape, max_model_len=max_model_len, first=True)
    while True:
        yield request_body(rng, model, shape, max_model_len=max_model_len, first=False)


class ClosedLoop:
    """``clients`` closed-loop clients: each sends its next request when the last one ends."""

    def __init__(
        self,
        base: str,
        model: str,
        clients: int,
        seed: int,
        shape: TrafficShape,
        *,
        max_model_len: int,
    ) -> None:
        shape.check_fits(max_model_len)  # here, not inside the clients' tasks
        limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients)
        self._http = httpx.AsyncClient(base_url=base, timeout=600, limits=limits)
        self._stopping = False
        self.sent = 0
        self.failed = 0
        self._tasks = [
            asyncio.create_task(
                self._client(client_requests(seed, i, model, shape, max_model_len=max_model_len))
            )
            for i in range(clients)
        ]

    async def _client(self, requests: Iterator[Row]) -> None:
        while not self._stopping:
            body = next(requests)
            self.sent += 1
            try:
                (await self._http.post("/v1/completions", json=body)).raise_for_status()
            except httpx.HTTPError:
                self.failed += 1
                await asyncio.sleep(0.5)

    async def stop(self) -> None:
        """No new requests, the ones in flight abandoned at once: their connections close and
        the server aborts them (a change of traffic must not wait for the old requests)."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._http.aclose()

    async def drain(self, timeout_s: float = 60) -> None:
        """No new requests; wait for every request in flight to finish (cancelled after
        ``timeout_s``: a server that stopped answering must not hang the run)."""
        self._stopping = True
        _, late = await asyncio.wait(self._tasks, timeout=timeout_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._http.aclose()
