"""A small stand-in for vLLM 0.26 + the TableTune plugin, built from the plugin's real parts, for
dry runs of bench/gpu/live_step_time.py (tests/integration/test_live_step_time_dry_run.py, and
bench/gpu/live_step_time.sh with SERVER_MODULE=tests.support.vllm_stand_in on a CPU) and of
bench/gpu/profile_fast.sh (tests/integration/test_profile_fast_dry_run.py).

A scheduler loop in real time: each step reads the installed lookup (``dynamic_sd_lookup[B]``, a
list, the plugin's ``StepPolicy`` or its ``NightjarLookup``) for the drafts of the next step (as
async scheduling does), sleeps T(B, k) for that k (a step's time follows the drafts it makes,
as vLLM's on an H200), and calls its
``update_from_output`` (with each request's sampled tokens), wrapped by the plugin's real
``wrap_update_from_output``. The HTTP side is the real ``TableTuneEndpoint``
(admin API, sync loop every ``TABLETUNE_SYNC_INTERVAL_S``) and ``TableTuneMetrics`` over the
engine-side controller; vLLM's own counters are prometheus_client objects of vLLM's names.
Acceptance is the synthetic 0.75/0.55/0.40, kept deterministically (fractions carried over);
the profiler hook's ``/collective_rpc`` switches it (all zeros: every guess rejected). A
completion may hold a list of prompts (that many requests); a client that goes away aborts its
requests, as vLLM's ``with_cancellation`` does. With ``STAND_IN_OLD_PLUGIN=1`` the admin API
has no step-cells route, as a plugin from before it (the profiler then reads /metrics).

    python -m tests.support.vllm_stand_in --port 8000 [vLLM's other flags, ignored]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
from argparse import Namespace
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send

from tabletune.admin.protocol import STEP_CELLS_PATH
from tabletune.plugin import wire
from tabletune.plugin.engine import build_controller, step_timer_of, wrap_update_from_output
from tabletune.plugin.http import TableTuneEndpoint
from tabletune.plugin.metrics_core import TableTuneMetrics
from tabletune.profiler.hook_protocol import HOOK_METHOD, SamplerMode
from tabletune.schemas.table import dense_lookup

RATES = (0.75, 0.55, 0.40)
OLD_PLUGIN_ENV = "STAND_IN_OLD_PLUGIN"
START_TABLE = [[1, 1, 0], [2, 2, 1], [3, 3, 2], [4, 256, 3]]


def step_s(batch: int, k: int) -> float:
    """k=2 clearly out-produces k=3 here: 2.3/6 ms vs 2.7/11 ms per request."""
    return 0.002 + 0.001 * k * k + 0.00002 * batch


@dataclass
class Pending:
    prompt: int
    max_tokens: int
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    produced: int = 0
    drafts: int = -1  # -1: not yet prefilled
    carry: float = 0.0


class Scheduler:
    """What the plugin reads of vLLM's Scheduler; update_from_output does the bookkeeping."""

    def __init__(self, engine: StandIn) -> None:
        self.engine = engine
        self.num_spec_tokens = 3
        self.scheduler_config = SimpleNamespace(max_num_seqs=256)
        # vLLM builds the lookup from the starting table at start.
        self.dynamic_sd_lookup: Any = dense_lookup([(a, b, k) for a, b, k in START_TABLE], 256, 3)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> None:
        self.engine.finish_step(scheduler_output, model_runner_output)

    def has_requests(self) -> bool:
        return bool(self.engine.running or self.engine.waiting)


Scheduler.update_from_output = wrap_update_from_output(  # type: ignore[method-assign]
    Scheduler.update_from_output
)


class WithoutStepCells:
    """The step-cells route answered as FastAPI answers an unknown path (a plain ASGI layer:
    Starlette's BaseHTTPMiddleware would hide a client's disconnect from the routes)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == STEP_CELLS_PATH:
            await JSONResponse({"detail": "Not Found"}, status_code=404)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class StandIn:
    def __init__(self, *, tensor_parallel_size: int = 1) -> None:
        self.registry = CollectorRegistry()
        labels = ["engine", "model_name"]

        def counter(name: str) -> Any:
            return Counter(name, name, labels, registry=self.registry).labels("0", "qwen3-4b")

        self.generation = counter("vllm:generation_tokens")
        self.prompt_tokens = counter("vllm:prompt_tokens")
        self.drafts = counter("vllm:spec_decode_num_drafts")
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens")
        self.accepted = counter("vllm:spec_decode_num_accepted_tokens")
        self.accepted_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "p",
            [*labels, "position"],
            registry=self.registry,
        )
        self.position_carry = [0.0] * len(RATES)  # per-position counts, fractions carried over
        self.success = counter("vllm:request_success")
        counter("vllm:num_preemptions")
        self.iterations = Histogram(
            "vllm:iteration_tokens_total", "t", labels, registry=self.registry
        ).labels("0", "qwen3-4b")
        self.running_gauge = Gauge("vllm:num_requests_running", "r", labels, registry=self.registry)
        Gauge("vllm:num_requests_waiting", "w", labels, registry=self.registry)
        self.scheduler = Scheduler(self)
        spec = SimpleNamespace(
            num_speculative_tokens=3, num_speculative_tokens_per_batch_size=START_TABLE
        )
        self.vllm_config = SimpleNamespace(
            speculative_config=spec,
            model_config=SimpleNamespace(served_model_name="qwen3-4b"),
            parallel_config=SimpleNamespace(tensor_parallel_size=tensor_parallel_size),
        )
        self.controller = build_controller(
            SimpleNamespace(scheduler=self.scheduler, vllm_config=self.vllm_config),
            engine_version="0.26.0",
        )
        self.running: list[Pending] = []
        self.waiting: list[Pending] = []
        self.wake = asyncio.Event()
        self.rates: tuple[float, ...] = RATES

    async def call_utility_async(self, name: str, *args: Any) -> Any:
        if name == wire.GET_STEP_CELLS:
            return step_timer_of(self.scheduler).to_wire()
        methods = {
            wire.GET_TABLE: self.controller.get,
            wire.PUT_TABLE: self.controller.put_table,
            wire.PUT_SETTINGS: self.controller.put_settings,
        }
        return methods[name](*args)

    async def loop(self) -> None:
        while True:
            if not self.running and not self.waiting:
                self.wake.clear()
                await self.wake.wait()
            self.running += self.waiting
            self.waiting = []
            batch = len(self.running)
            tokens = {str(id(r)): r.prompt if r.drafts < 0 else 1 + r.drafts for r in self.running}
            spec = {str(id(r)): [-1] * r.drafts for r in self.running if r.drafts > 0}
            next_k = self.scheduler.dynamic_sd_lookup[batch]  # read once per step, as vLLM does
            # A step's time follows the drafts it makes (vLLM on an H200, step_timer.py).
            await asyncio.sleep(step_s(batch, next_k))
            output = SimpleNamespace(
                num_scheduled_tokens=tokens,
                total_num_scheduled_tokens=sum(tokens.values()),
                scheduled_spec_decode_tokens=spec,
                scheduled_new_reqs=[r for r in self.running if r.drafts < 0],  # prompt's step
                finished_req_ids=set(),  # vLLM's: those finished in the step before
                num_spec_tokens_to_schedule=next_k,
            )
            # What each request sampled: filled in by finish_step (vLLM's model runner has
            # them before update_from_output; here acceptance is decided there).
            self.scheduler.update_from_output(output, SimpleNamespace(sampled_token_ids=[]))

    def finish_step(self, output: Any, runner: Any) -> None:
        kept = 0
        for request in self.running:
            if request.drafts < 0:
                request.produced, kept = 1, kept + 1
                self.prompt_tokens.inc(request.prompt)
                runner.sampled_token_ids.append([0])
            else:
                k = request.drafts
                request.carry += sum(self.rates[:k])
                accepted = math.floor(request.carry)
                request.carry -= accepted
                new = min(1 + accepted, request.max_tokens - request.produced)
                request.produced += new
                kept += new
                runner.sampled_token_ids.append([0] * new)
                if k:
                    self.drafts.inc()
                    self.draft_tokens.inc(k)
                    self.accepted.inc(accepted)
                    self.count_positions(k)
            request.drafts = output.num_spec_tokens_to_schedule
        self.generation.inc(kept)
        self.iterations.observe(output.total_num_scheduled_tokens)
        for request in [r for r in self.running if r.produced >= r.max_tokens]:
            self.running.remove(request)
            self.success.inc()
            request.done.set_result(None)
        self.running_gauge.labels("0", "qwen3-4b").set(len(self.running))

    def count_positions(self, k: int) -> None:
        """Position i of a draft of k is accepted with probability rates[i] (all i < k)."""
        for i in range(k):
            self.position_carry[i] += self.rates[i]
            whole = math.floor(self.position_carry[i])
            self.position_carry[i] -= whole
            self.accepted_per_pos.labels("0", "qwen3-4b", str(i)).inc(whole)

    def abort(self, pendings: list[Pending]) -> None:
        """Requests whose client went away leave the batch before the next step."""
        gone = {id(p) for p in pendings}
        self.running = [r for r in self.running if id(r) not in gone]
        self.waiting = [r for r in self.waiting if id(r) not in gone]
        for pending in pendings:
            pending.done.cancel()

    def app(self) -> FastAPI:
        plugin = TableTuneEndpoint(metrics=TableTuneMetrics(self.registry))

        @asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[None]:
            engine_client = SimpleNamespace(
                vllm_config=self.vllm_config,
                engine_core=SimpleNamespace(call_utility_async=self.call_utility_async),
            )
            await plugin.init_state(engine_client, app.state, Namespace())
            self.task = asyncio.create_task(self.loop())
            yield
            self.task.cancel()
            app.state.tabletune_sync_task.cancel()

        app = FastAPI(lifespan=lifespan)
        plugin.attach_router(app)
        if os.environ.get(OLD_PLUGIN_ENV) == "1":
            app.add_middleware(WithoutStepCells)

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=200)

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(generate_latest(self.registry), media_type="text/plain")

        @app.get("/v1/models")
        async def models() -> JSONResponse:
            return JSONResponse({"data": [{"id": "qwen3-4b"}]})

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            body = await request.json()
            prompt = body["prompt"]
            several = isinstance(prompt, list) and isinstance(prompt[0], list | str)
            prompts = prompt if several else [prompt]
            pendings = [
                Pending(len(p.split()) if isinstance(p, str) else len(p), body["max_tokens"])
                for p in prompts
            ]
            self.waiting += pendings
            self.wake.set()
            finished = asyncio.gather(*(p.done for p in pendings))
            while not finished.done():
                try:
                    await asyncio.wait_for(asyncio.shield(finished), 0.05)
                except TimeoutError:
                    if await request.is_disconnected():
                        self.abort(pendings)
                        finished.cancel()
                        return Response(status_code=499)
            tokens = len(prompts) * body["max_tokens"]
            return JSONResponse({"usage": {"completion_tokens": tokens}})

        @app.post("/collective_rpc")
        async def collective_rpc(request: Request) -> JSONResponse:
            body = await request.json()
            if body.get("method") != HOOK_METHOD:
                return JSONResponse({"error": "Method not implemented"}, status_code=500)
            mode = SamplerMode.from_json(json.loads(body["args"][0]))
            self.rates = mode.rates if mode.kind == "synthetic" else RATES
            return JSONResponse({"results": [mode.to_json()]})

        return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)  # reported, not used
    args, _ = parser.parse_known_args()  # vLLM's other flags are accepted and ignored
    stand_in = StandIn(tensor_parallel_size=args.tensor_parallel_size)
    uvicorn.run(stand_in.app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
