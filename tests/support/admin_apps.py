"""The admin API as the vLLM plugin and the emulator serve it, in process, for the security tests
and the fuzzer: the same requests reach both, the engine state behind each is inspectable.

- ``plugin_app``: ``TableTuneEndpoint`` in a FastAPI app with CORSMiddleware added after it as
  vLLM 0.26 adds it (``allow_origins=["*"]``, methods and headers ``*``), and a fake engine
  client whose utility calls cross a msgpack-like encoding check (what vLLM's engine-core
  process boundary refuses) before the real ``EngineTableController``.
- ``sim_app``: the emulator's app (``tabletune.sim.app.build_app``) on a fake wall clock, its
  access rules from the same variables (``tabletune.sim.cli.admin_auth``).
"""

from __future__ import annotations

import asyncio
import os
from argparse import Namespace
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from tabletune.admin.auth import OPEN_ENV, TOKEN_ENV, TOKEN_FILE_ENV, VLLM_API_KEY_ENV
from tabletune.admin.state import TableState
from tabletune.plugin import wire
from tabletune.plugin.engine import TIMER_ATTR, build_controller, step_timer_of
from tabletune.plugin.http import TableTuneEndpoint
from tabletune.plugin.metrics_core import TableTuneMetrics
from tabletune.plugin.step_timer import StepTimer
from tabletune.schemas import load_profile
from tabletune.schemas.table import dense_lookup
from tabletune.sim.app import ReplicaSet, build_app
from tabletune.sim.cli import admin_auth
from tabletune.sim.replica import Replica, SimClock
from tabletune.sim.scenario import parse_scenario

REPO = Path(__file__).resolve().parents[2]
K = 3
MAX_NUM_SEQS = 256
START = [[1, 1, 0], [2, 2, 1], [3, 3, 2], [4, 256, 3]]  # every k of 0..K captured
TOKEN = "s3cret-0123456789abcdef"
ADMIN_VARIABLES = (TOKEN_ENV, TOKEN_FILE_ENV, OPEN_ENV, VLLM_API_KEY_ENV)
LOCAL = "http://127.0.0.1:8000"
LOOPBACK_CLIENT = ("127.0.0.1", 50000)
SERVER = ("127.0.0.1", 8000)
REMOTE_CLIENT = ("10.1.2.3", 50000)
MSGPACK_INT = (-(2**63), 2**64 - 1)
WALL = 1_000_000.0
"""the wall time both engines started at (the emulator's clock never moves from it)"""


def msgpack_problem(value: object) -> str | None:
    """Why msgpack (vLLM's engine-core IPC) could not encode ``value``, or None."""
    if value is None or isinstance(value, bool | float | str | bytes):
        return None
    if isinstance(value, int):
        low, high = MSGPACK_INT
        return None if low <= value <= high else f"integer {value} beyond 64 bits"
    if isinstance(value, list | tuple):
        return next((p for item in value if (p := msgpack_problem(item))), None)
    if isinstance(value, dict):
        for key, item in value.items():
            problem = msgpack_problem(key) or msgpack_problem(item)
            if problem:
                return problem
        return None
    return f"cannot encode {type(value).__name__}"


def _fake_core() -> Any:
    spec = SimpleNamespace(num_speculative_tokens=K, num_speculative_tokens_per_batch_size=START)
    scheduler = SimpleNamespace(
        num_spec_tokens=K,
        scheduler_config=SimpleNamespace(max_num_seqs=MAX_NUM_SEQS),
        dynamic_sd_lookup=dense_lookup([(s, e, k) for s, e, k in START], MAX_NUM_SEQS, K),
    )
    vllm_config = SimpleNamespace(
        speculative_config=spec,
        model_config=SimpleNamespace(served_model_name="qwen3-4b"),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )
    return SimpleNamespace(scheduler=scheduler, vllm_config=vllm_config)


class MsgpackEngine:
    """vLLM's engine client as the plugin uses it. A utility call whose arguments msgpack could
    not carry fails as vLLM's does (a bare Exception), which the plugin turns into a 503."""

    def __init__(self) -> None:
        self.core = _fake_core()
        setattr(self.core.scheduler, TIMER_ATTR, StepTimer(started_at=WALL))
        self.controller = build_controller(self.core, engine_version="0.26.0")
        self.calls: list[str] = []
        self.vllm_config = self.core.vllm_config
        self.engine_core = SimpleNamespace(call_utility_async=self.call_utility_async)

    async def call_utility_async(self, name: str, *args: Any) -> Any:
        self.calls.append(name)
        problem = msgpack_problem(list(args))
        if problem is not None:
            raise Exception(f"Call to {name} method failed: {problem}")
        methods: dict[str, Callable[..., Any]] = {
            wire.GET_TABLE: self.controller.get,
            wire.PUT_TABLE: self.controller.put_table,
            wire.PUT_SETTINGS: self.controller.put_settings,
            wire.GET_STEP_CELLS: step_timer_of(self.core.scheduler).to_wire,
        }
        return methods[name](*args)


def count_steps(timer: StepTimer, *, batch: int, k: int, steps: int) -> None:
    """``steps`` counted steps of ``batch`` requests verifying ``k`` drafts, 10 ms each (the
    first call only starts the clock)."""
    tokens = {f"r{i}": 1 + k for i in range(batch)}
    spec = {f"r{i}": [0] * k for i in range(batch)} if k else {}
    for i in range(steps + 1):
        timer.on_step(0.01 * i, tokens, sum(tokens.values()), spec, idle_after=False, drafts_next=k)


@dataclass
class AdminApp:
    """One server's admin API and what stands behind it."""

    name: str
    app: FastAPI
    state: Callable[[], TableState]
    installed: Callable[[], object] = lambda: None
    """what the engine runs (the plugin: the scheduler's lookup object)"""
    engine_calls: list[str] = field(default_factory=list)
    timer: StepTimer | None = None
    """the plugin's engine-side step timer (tests count steps into it)"""

    def client(
        self, *, client: tuple[str, int] = ("testclient", 50000), base_url: str = LOCAL
    ) -> TestClient:
        return TestClient(self.app, base_url=base_url, client=client)


@dataclass
class RawAnswer:
    status: int
    body: bytes
    headers: dict[bytes, bytes]
    pulled: int
    """body messages the app asked for"""


async def asgi_request(
    app: FastAPI,
    *,
    method: str,
    path: str,
    headers: Iterable[tuple[bytes, bytes]],
    chunks: Iterable[bytes],
    client: tuple[str, int] = LOOPBACK_CLIENT,
) -> RawAnswer:
    """A request straight at the ASGI app: header bytes as given (a test client re-encodes
    them), the body in ``chunks`` (possibly endless), as a server hands them over."""
    body_chunks = iter(chunks)
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        chunk = next(body_chunks, None)
        return {"type": "http.request", "body": chunk or b"", "more_body": chunk is not None}

    async def respond(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": list(headers),
        "client": client,
        "server": SERVER,
    }
    await app(scope, receive, respond)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return RawAnswer(start["status"], body, dict(start.get("headers", [])), pulled)


@contextmanager
def admin_environment(env: Mapping[str, str]) -> Iterator[None]:
    """The process environment with only ``env`` among the admin API's variables."""
    clean = {k: v for k, v in os.environ.items() if k not in ADMIN_VARIABLES}
    with mock.patch.dict(os.environ, {**clean, **env}, clear=True):
        yield


def plugin_app(
    env: Mapping[str, str], *, args: Namespace | None = None, engine: bool = True
) -> AdminApp:
    """vLLM's app with the plugin attached and initialised under ``env``."""
    endpoint = TableTuneEndpoint(metrics=TableTuneMetrics(CollectorRegistry()))
    app = FastAPI()
    endpoint.attach_router(app)
    app.add_middleware(  # after the plugins, as vLLM's build_app does
        CORSMiddleware,
        allow_origins=["*"],
        allow_credentials=False,
        allow_methods=["*"],
        allow_headers=["*"],
    )
    fake = MsgpackEngine() if engine else None
    with admin_environment({**env, "TABLETUNE_SYNC_INTERVAL_S": "0"}):
        asyncio.run(endpoint.init_state(fake, app.state, args or Namespace()))
    if fake is None:
        static = TableState.initial(START, num_speculative_tokens=K, max_num_seqs=MAX_NUM_SEQS)
        return AdminApp("plugin", app, lambda: static)
    return AdminApp(
        "plugin",
        app,
        state=lambda: fake.controller.state,
        installed=lambda: fake.core.scheduler.dynamic_sd_lookup,
        engine_calls=fake.calls,
        timer=step_timer_of(fake.core.scheduler),
    )


def sim_app(env: Mapping[str, str]) -> AdminApp:
    """The emulator's app, one replica, with the same starting table, under ``env``."""
    scenario = parse_scenario(
        {
            "name": "admin",
            "engine": {
                "num_speculative_tokens": K,
                "max_num_seqs": MAX_NUM_SEQS,
                "starting_table": START,
            },
            "load": {"kind": "constant", "batch_size": 24},
            "acceptance": {"kind": "constant", "rates": [0.8, 0.6, 0.4]},
        },
        source="admin_apps",
    )
    # never moves: the engine does not step between requests
    clock = SimClock(speed=1.0, start_wall=WALL, wall=lambda: WALL)
    profile = load_profile(REPO / "examples" / "sample-profile.json")
    replica = Replica(scenario, profile, base_dir=REPO, clock=clock)
    with admin_environment(env):
        auth = admin_auth(scenario, os.environ)
    app = build_app(ReplicaSet({8000: replica}), auth=auth)
    return AdminApp("sim", app, state=lambda: replica.controller.state)


APPS: dict[str, Callable[[Mapping[str, str]], AdminApp]] = {"plugin": plugin_app, "sim": sim_app}
