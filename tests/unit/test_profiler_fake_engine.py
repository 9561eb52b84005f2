"""A small fake of vLLM 0.26 + the TableTune plugin + the profiler hook, for the profiler tests.

It behaves like the real server from the outside: ``/v1/completions`` (a list of prompts runs as
that many concurrent requests), ``/metrics`` with vLLM's spec-decode counters, the admin API
(the shared ``install_admin_api`` over a ``LocalBackend``), ``/collective_rpc`` for the hook, and
``/health``. Time is virtual: each completion advances a ``VirtualClock`` by what the request
would take (prefill + steps x T(B, k)), so the tests know the exact step time to expect.

Run as a module it is a stand-in for ``vllm.entrypoints.openai.api_server`` (same flags), using
real time, for the tests that launch a server process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from tabletune.admin.auth import AdminAuth
from tabletune.admin.local import LocalBackend
from tabletune.admin.protocol import EngineIdentity
from tabletune.admin.router import install_admin_api
from tabletune.admin.state import TableState
from tabletune.profiler.hook_protocol import HOOK_METHOD, SamplerMode
from tests.support.servers import free_port

StepFn = Callable[[int, int], float]  # (B, k) -> step ms; k = -1: no speculation


class VirtualClock:
    def __init__(self) -> None:
        self._now = 1000.0
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


def linear_steps(base_ms: float = 4.0, per_b_ms: float = 0.05, per_k_ms: float = 0.3) -> StepFn:
    def step(b: int, k: int) -> float:
        return base_ms + per_b_ms * b + per_k_ms * max(k, 0)

    return step


@dataclass
class FakeConfig:
    step_ms: StepFn = field(default_factory=linear_steps)
    prefill_ms: float = 3.0
    overhead_ms: float = 1.0
    num_speculative_tokens: int = 3
    max_num_seqs: int = 32
    starting_table: list[list[int]] | None = field(
        default_factory=lambda: [[1, 1, 3], [2, 2, 2], [3, 3, 1], [4, 32, 0]]
    )
    speculative: bool = True
    sampler: SamplerMode = field(default_factory=lambda: SamplerMode("standard"))
    standard_rates: tuple[float, ...] = (0.6, 0.4, 0.2)
    """what the 'serving' sampler accepts (per position, unconditional)"""
    plugin: bool = True
    hook: bool = True
    dev_mode: bool = True
    table_swap_works: bool = True
    """False: PUT answers but the engine keeps drafting the starting table's k (a broken swap)"""
    honour_ignore_eos: bool = True
    engine_version: str = "0.26.0"
    tensor_parallel_size: int | None = 1
    tokenizer: bool = True
    """False: text prompts fail with a 500, as on a server started with --skip-tokenizer-init"""


class FakeEngine:
    def __init__(self, config: FakeConfig, *, clock: VirtualClock | None = None) -> None:
        self.config = config
        self.clock = clock or VirtualClock()
        self.real_time = False
        self.healthy = True
        self.fail_next: list[int] = []
        """statuses to answer the next completions with (then normal again)"""
        self.hang_next = 0
        self.hang_s = 1.0  # how long a hung request waits: longer than the client's timeout
        """completions that never answer in time (real sleep; pair with a short timeout)"""
        self.completions: list[tuple[int, int, int]] = []
        """(B, max_tokens, k) of every completion served"""
        self.extra_metrics: Callable[[], str] = lambda: ""
        """more /metrics text (the plugin's step cells, from a step-level fake)"""
        self.drafts = 0.0
        self.draft_tokens = 0.0
        self.accepted_per_pos = [0.0] * max(config.num_speculative_tokens, 1)
        self.backend: LocalBackend | None = None
        if config.speculative:
            state = TableState.initial(
                config.starting_table,
                num_speculative_tokens=config.num_speculative_tokens,
                max_num_seqs=config.max_num_seqs,
            )
            self.backend = LocalBackend(
                state,
                identity=EngineIdentity(
                    config.engine_version, tensor_parallel_size=config.tensor_parallel_size
                ),
            )
        self._initial_state = self.backend.state if self.backend else None
        self.app = self._build_app()

    # -- engine model --------------------------------------------------------------------------
    def k_at(self, b: int) -> int:
        if not self.config.speculative or self.backend is None:
            return -1
        state = self.backend.state if self.config.table_swap_works else self._initial_state
        assert state is not None
        return state.k_for(b)

    def rates(self) -> tuple[float, ...]:
        sampler = self.config.sampler
        if sampler.kind == "synthetic":
            return sampler.rates
        return self.config.standard_rates

    def serve_completion(self, b: int, max_tokens: int) -> float:
        """Counters and the virtual duration (seconds) of b requests of max_tokens each."""
        k = self.k_at(b)
        rates = self.rates()
        if k <= 0:
            steps = max_tokens - 1
        else:
            tau = 1.0 + sum(rates[:k])
            steps = math.ceil((max_tokens - 1) / tau)
            self.drafts += b * steps
            self.draft_tokens += b * steps * k
            for i in range(k):
                self.accepted_per_pos[i] += b * steps * rates[i]
        self.completions.append((b, max_tokens, k))
        ms = self.config.overhead_ms + self.config.prefill_ms + steps * self.config.step_ms(b, k)
        return ms / 1000.0

    def metrics_text(self) -> str:
        labels = 'engine="0",model_name="fake"'
        lines = []
        accepted = sum(self.accepted_per_pos)
        for name, value in (
            ("vllm:spec_decode_num_drafts", self.drafts),
            ("vllm:spec_decode_num_draft_tokens", self.draft_tokens),
            ("vllm:spec_decode_num_accepted_tokens", accepted),
        ):
            lines += [f"# TYPE {name} counter", f"{name}_total{{{labels}}} {value}"]
            lines.append(f"{name}_created{{{labels}}} 1.7e9")
        name = "vllm:spec_decode_num_accepted_tokens_per_pos"
        lines.append(f"# TYPE {name} counter")
        for i, value in enumerate(self.accepted_per_pos):
            lines.append(f'{name}_total{{{labels},position="{i}"}} {value}')
        return "\n".join(lines) + "\n"

    # -- HTTP ----------------------------------------------------------------------------------
    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=200 if self.healthy else 503)

        @app.get("/v1/models")
        async def models() -> JSONResponse:
            return JSONResponse({"data": [{"id": "fake-model"}]})

        @app.get("/metrics")
        async def metrics() -> PlainTextResponse:
            return PlainTextResponse(self.metrics_text() + self.extra_metrics())

        @app.post("/v1/completions")
        async def completions(request: Request) -> JSONResponse:
            body = await request.json()
            if self.hang_next > 0:
                self.hang_next -= 1
                await asyncio.sleep(self.hang_s)
            if self.fail_next:
                status = self.fail_next.pop(0)
                return JSONResponse({"error": "injected"}, status_code=status)
            prompts = body["prompt"]
            if isinstance(prompts, str) or not isinstance(prompts[0], list | str):
                prompts = [prompts]
            if not self.config.tokenizer and any(isinstance(p, str) for p in prompts):
                return JSONResponse({"error": "no tokenizer"}, status_code=500)
            b = len(prompts)
            max_tokens = int(body.get("max_tokens", 16))
            if b > self.config.max_num_seqs * 4:
                return JSONResponse({"error": "too many"}, status_code=400)
            seconds = self.serve_completion(b, max_tokens)
            if self.real_time:
                time.sleep(seconds)
            else:
                self.clock.advance(seconds)
            ran_to_max = body.get("ignore_eos") and self.config.honour_ignore_eos
            per_request = max_tokens if ran_to_max else max(1, max_tokens // 2)
            return JSONResponse(
                {
                    "choices": [{"index": i, "text": ""} for i in range(b)],
                    "usage": {"completion_tokens": b * per_request},
                }
            )

        @app.post("/collective_rpc")
        async def rpc(request: Request) -> Response:
            if not self.config.dev_mode:
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            body = await request.json()
            if not self.config.hook or body.get("method") != HOOK_METHOD:
                return JSONResponse({"error": "Method not implemented"}, status_code=500)
            mode = SamplerMode.from_json(json.loads(body["args"][0]))
            self.config.sampler = mode
            return JSONResponse({"results": [mode.to_json()]})

        if self.config.plugin and self.backend is not None:
            backend = self.backend
            # vLLM as the profiler launches it: writes from this machine (TABLETUNE_ADMIN_OPEN).
            install_admin_api(
                app, lambda _request: backend, lambda _request: AdminAuth(open_loopback=True)
            )
        return app

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Run on a free port in a thread; yields the base URL."""
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="error")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake engine did not start")
            time.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            thread.join(timeout=10)


# -- run as a stand-in for vLLM's api_server ----------------------------------------------------
def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--speculative-config")
    parser.add_argument("--fake-exit-at-start", type=int, default=None)
    parser.add_argument("--fake-step-ms", type=float, default=0.2)
    parser.add_argument("--fake-never-healthy", action="store_true")
    parser.add_argument("--fake-no-hook", action="store_true")
    args, _vllm_flags_we_ignore = parser.parse_known_args(argv)
    print(f"fake vLLM starting: model={args.model}", flush=True)
    if args.fake_exit_at_start is not None:
        print("RuntimeError: CUDA out of memory (fake)", flush=True)
        raise SystemExit(args.fake_exit_at_start)
    spec: dict[str, Any] = json.loads(args.speculative_config) if args.speculative_config else {}
    sampler = SamplerMode("standard")
    if spec.get("rejection_sample_method") == "synthetic":
        sampler = SamplerMode("synthetic", tuple(spec["synthetic_acceptance_rates"]))
    config = FakeConfig(
        step_ms=lambda b, k: args.fake_step_ms,
        prefill_ms=0.0,
        overhead_ms=0.0,
        num_speculative_tokens=int(spec.get("num_speculative_tokens", 0)) or 1,
        max_num_seqs=args.max_num_seqs,
        starting_table=spec.get("num_speculative_tokens_per_batch_size"),
        speculative=bool(spec),
        sampler=sampler,
        hook=not args.fake_no_hook,
    )
    engine = FakeEngine(config)
    engine.real_time = True
    engine.healthy = not args.fake_never_healthy
    uvicorn.run(engine.app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    _main()


# -- the fake's own checks ----------------------------------------------------------------------
def test_fake_counts_drafts_and_advances_the_clock_by_the_model() -> None:
    engine = FakeEngine(FakeConfig(sampler=SamplerMode.rejecting_all(3)))
    seconds = engine.serve_completion(2, 65)  # starting table: k=2 at B=2
    assert engine.drafts == 2 * 64
    assert engine.draft_tokens == 2 * 64 * 2
    assert sum(engine.accepted_per_pos) == 0
    assert seconds == (1.0 + 3.0 + 64 * (4.0 + 0.05 * 2 + 0.3 * 2)) / 1000.0


def test_fake_metrics_parse_as_vllm_counters() -> None:
    from tabletune.profiler.metrics import parse_spec_counters

    engine = FakeEngine(FakeConfig())
    engine.serve_completion(1, 11)  # k=3, standard rates: tau 2.2 -> 5 steps
    counters = parse_spec_counters(engine.metrics_text())
    assert counters.drafts == 5
    assert counters.draft_tokens == 15
    assert counters.accepted_per_pos == (3.0, 2.0, 1.0)
