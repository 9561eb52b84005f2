"""The endpoint plugin in a FastAPI app with a fake engine client that records calls and
answers through the real engine-side controller: every error status leaves the table as it was."""

from __future__ import annotations

import asyncio
from argparse import Namespace
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from tabletune.admin.auth import OPEN_ENV, TOKEN_ENV, TOKEN_FILE_ENV, VLLM_API_KEY_ENV
from tabletune.admin.protocol import (
    MAX_BODY_BYTES,
    SETTINGS_PATH,
    STEP_CELLS_PATH,
    TABLE_PATH,
    StepCellsRead,
)
from tabletune.admin.state import AdminError
from tabletune.plugin import http as http_module
from tabletune.plugin import wire
from tabletune.plugin.engine import TIMER_ATTR, build_controller, step_timer_of
from tabletune.plugin.engine_backend import EngineUtilityBackend, sync_views
from tabletune.plugin.http import TableTuneEndpoint
from tabletune.plugin.metrics_core import TableTuneMetrics
from tabletune.step_cells import CellTotals, cells_to_wire

from .test_plugin_controller import START, fake_core

TOKEN = "s3cret-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class FakeEngineClient:
    """vLLM's engine client as the plugin uses it; utility calls go to a real controller."""

    def __init__(self, table: list[list[int]] | None = START, *, fail: bool = False) -> None:
        self.core = fake_core(table)
        self.controller = build_controller(self.core, engine_version="0.26.0")
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.fail = fail
        self.vllm_config = self.core.vllm_config
        self.engine_core = SimpleNamespace(call_utility_async=self.call_utility_async)

    async def call_utility_async(self, name: str, *args: Any) -> Any:
        self.calls.append((name, args))
        if self.fail:
            raise Exception("Call to tabletune_get_table method failed: no such method")
        methods = {
            wire.GET_TABLE: self.controller.get,
            wire.PUT_TABLE: self.controller.put_table,
            wire.PUT_SETTINGS: self.controller.put_settings,
            wire.GET_STEP_CELLS: step_timer_of(self.core.scheduler).to_wire,
        }
        return methods[name](*args)


def make_app(
    monkeypatch: pytest.MonkeyPatch,
    engine: FakeEngineClient | None,
    *,
    token: str | None = TOKEN,
) -> tuple[TestClient, CollectorRegistry]:
    if token:
        monkeypatch.setenv(TOKEN_ENV, token)
    else:
        monkeypatch.delenv(TOKEN_ENV, raising=False)
    for other in (TOKEN_FILE_ENV, OPEN_ENV, VLLM_API_KEY_ENV):
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv("TABLETUNE_SYNC_INTERVAL_S", "0")
    registry = CollectorRegistry()
    plugin = TableTuneEndpoint(metrics=TableTuneMetrics(registry))
    app = FastAPI()
    plugin.attach_router(app)
    asyncio.run(plugin.init_state(engine, app.state, Namespace()))
    return TestClient(app), registry


def test_conforms_to_vllms_endpoint_plugin_protocol() -> None:
    interface = pytest.importorskip("vllm.plugins.endpoint_plugins.interface")
    assert isinstance(TableTuneEndpoint(), interface.EndpointPlugin)


def test_has_what_vllms_loader_reads() -> None:
    plugin = TableTuneEndpoint()
    assert plugin.name == "tabletune_http" and plugin.required_tasks is None
    assert callable(plugin.attach_router) and asyncio.iscoroutinefunction(plugin.init_state)


def test_get_goes_to_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngineClient()
    client, _ = make_app(monkeypatch, engine)
    response = client.get(TABLE_PATH, headers=AUTH)
    assert response.status_code == 200 and response.json()["table"] == START
    assert engine.calls == [(wire.GET_TABLE, ())]


def test_put_reaches_the_scheduler_and_updates_the_gauges(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngineClient()
    client, registry = make_app(monkeypatch, engine)
    response = client.put(
        TABLE_PATH, json={"table": [[1, 64, 3], [65, 256, 1]]}, headers={**AUTH, "If-Match": '"0"'}
    )
    assert response.status_code == 200, response.text
    assert response.json()["version"] == 1 and response.headers["etag"] == '"1"'
    assert engine.calls[-1] == (
        wire.PUT_TABLE,
        ({"table": [[1, 64, 3], [65, 256, 1]], "allow_uncaptured": False}, 0),
    )
    assert engine.core.scheduler.dynamic_sd_lookup[64] == 3
    assert engine.core.scheduler.dynamic_sd_lookup[65] == 1
    labels = {"model_name": "qwen3-4b", "engine": "0"}
    assert registry.get_sample_value("tabletune_table_version", labels) == 1
    k_65 = {**labels, "range_start": "65", "range_end": "256"}
    assert registry.get_sample_value("tabletune_table_range_k", k_65) == 1


def test_settings_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngineClient()
    client, _ = make_app(monkeypatch, engine)
    response = client.put(SETTINGS_PATH, json={"exploration_interval": 50}, headers=AUTH)
    assert response.status_code == 200 and response.json()["exploration_interval"] == 50
    assert engine.calls[-1] == (wire.PUT_SETTINGS, ({"exploration_interval": 50}, None))
    assert client.get(SETTINGS_PATH, headers=AUTH).json()["hysteresis"] == 0


@pytest.mark.parametrize(
    ("kwargs", "status"),
    [
        ({"json": {"table": [[1, 8, 3], [8, 256, 1]]}}, 422),  # overlap
        ({"json": {"table": [[2, 256, 1]]}}, 422),  # gap at 1
        ({"json": {"table": [[1, 256, 4]]}}, 422),  # k > K
        ({"json": {"table": [[1, 256, -1]]}}, 422),  # negative
        ({"json": {"table": [[1, 256, "1"]]}}, 422),  # wrong type
        ({"json": {"table": [[1, 256, 1]], "tabel": 1}}, 422),  # unknown field
        ({"json": [[1, 256, 1]]}, 422),  # not an object
        ({"content": b"{not json"}, 400),
        ({"content": b"x" * (MAX_BODY_BYTES + 1)}, 413),
        ({"json": {"table": [[1, 256, 1]]}, "headers": {"If-Match": '"9"'}}, 409),
        ({"json": {"table": [[1, 256, 1]]}, "headers": {"If-Match": "nine"}}, 400),
        ({"json": {"table": [[1, 256, 1]]}, "headers": {"Authorization": "Bearer wrong"}}, 401),
        ({"json": {"table": [[1, 256, 1]]}, "headers": {"Authorization": ""}}, 401),
    ],
)
def test_every_refusal_leaves_the_table_unchanged(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], status: int
) -> None:
    engine = FakeEngineClient()
    client, _ = make_app(monkeypatch, engine)
    lookup = engine.core.scheduler.dynamic_sd_lookup
    headers = {**AUTH, **kwargs.pop("headers", {})}
    response = client.put(TABLE_PATH, headers=headers, **kwargs)
    assert response.status_code == status, response.text
    assert response.json()["detail"]
    assert engine.core.scheduler.dynamic_sd_lookup is lookup
    view = client.get(TABLE_PATH, headers=AUTH).json()
    assert view["version"] == 0 and view["table"] == START


def test_static_k_engine_answers_409_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngineClient(None)
    client, _ = make_app(monkeypatch, engine)
    assert client.get(TABLE_PATH, headers=AUTH).json()["dynamic"] is False
    response = client.put(TABLE_PATH, json={"table": [[1, 256, 1]]}, headers=AUTH)
    assert response.status_code == 409 and "restart" in response.json()["detail"]


def test_no_engine_is_503(monkeypatch: pytest.MonkeyPatch) -> None:
    client, _ = make_app(monkeypatch, None)
    assert client.get(TABLE_PATH, headers=AUTH).status_code == 503
    assert client.put(TABLE_PATH, json={"table": [[1, 256, 1]]}, headers=AUTH).status_code == 503


def test_engine_without_the_engine_plugin_is_503_with_a_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, _ = make_app(monkeypatch, FakeEngineClient(fail=True))
    response = client.get(TABLE_PATH, headers=AUTH)
    assert response.status_code == 503 and "tabletune_engine" in response.json()["detail"]


def test_no_token_configured_means_reads_only(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngineClient()
    client, _ = make_app(monkeypatch, engine, token=None)
    assert client.get(TABLE_PATH).status_code == 200
    refused = client.put(TABLE_PATH, json={"table": [[1, 256, 1]]})
    assert refused.status_code == 403 and TOKEN_ENV in refused.json()["detail"]
    assert [name for name, _ in engine.calls] == [wire.GET_TABLE]


def test_malformed_engine_answer_is_a_502() -> None:
    async def answer(name: str, *args: Any) -> Any:
        return {"status": 200, "view": {"table": "?"}}

    with pytest.raises(AdminError) as caught:
        asyncio.run(EngineUtilityBackend(answer).get_view())
    assert caught.value.status == 502


def test_sync_keeps_polling_through_failures() -> None:
    engine = FakeEngineClient()
    seen: list[int] = []
    cells: list[float] = []
    failures = iter([True, True, False, False, True, False])

    async def flaky(name: str, *args: Any) -> Any:
        if next(failures):
            raise Exception("engine busy")
        return await engine.call_utility_async(name, *args)

    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    backend = EngineUtilityBackend(
        flaky,
        on_view=lambda view: seen.append(view.version),
        on_steps=lambda read: cells.append(read.started_at),
    )
    asyncio.run(sync_views(backend, interval_s=2.5, sleep=fake_sleep, max_rounds=3))
    started = step_timer_of(engine.core.scheduler).started_at
    assert seen == [0] and cells == [started, started] and slept == [2.5, 2.5, 2.5]


def engine_answer(started_at: float, steps: float) -> dict[str, Any]:
    totals = CellTotals(steps, steps * 0.01, steps * 0.0001, steps * 8, steps * 2)
    return {"started_at": started_at, **cells_to_wire({(1, 2, 2): totals}, 3)}


class ScriptedEngine:
    """Answers the view from a real controller and the step cells from a script."""

    def __init__(self, answers: list[object]) -> None:
        self.client = FakeEngineClient()
        self.answers = iter(answers)

    async def call(self, name: str, *args: Any) -> Any:
        if name == wire.GET_STEP_CELLS:
            return next(self.answers)
        return await self.client.call_utility_async(name, *args)


def sync_rounds(
    answers: list[object], registry: CollectorRegistry
) -> list[tuple[float | None, float | None]]:
    """Run one sync round per answer; after each, the exported steps and their ``_created``."""
    engine = ScriptedEngine(answers)
    metrics = TableTuneMetrics(registry).for_engine(model_name="qwen3-4b", engine="0")
    backend = EngineUtilityBackend(
        engine.call, on_view=metrics.publish_view, on_steps=metrics.publish_steps
    )
    labels = {"model_name": "qwen3-4b", "engine": "0", "k": "1", "batch": "2"}
    seen: list[tuple[float | None, float | None]] = []

    async def record(seconds: float) -> None:
        seen.append(
            (
                registry.get_sample_value("tabletune_steps_total", labels),
                registry.get_sample_value("tabletune_steps_created", labels),
            )
        )

    asyncio.run(sync_views(backend, interval_s=1.0, sleep=record, max_rounds=len(answers)))
    return seen


def test_sync_exports_the_engines_totals_and_a_restart_shows_as_new_created() -> None:
    seen = sync_rounds(
        [engine_answer(100.0, 5), engine_answer(100.0, 12), engine_answer(250.0, 2)],
        CollectorRegistry(),
    )
    assert seen == [(5, 100.0), (12, 100.0), (2, 250.0)]


@pytest.mark.parametrize(
    "malformed",
    [
        None,
        "cells",
        {"cells": [[1, 2, 2, 1, 0.1]], "started_at": 1.0},  # a row too short
        {"cells": [[1, 2, 3, 1, 0.1, 0.01, 2, 2]], "started_at": 1.0},  # not a cell
        {"cells": [[1, 2, 2, -1, 0.1, 0.01, 2, 2]], "started_at": 1.0},  # negative count
        {"cells": [], "started_at": "yesterday"},
        {"cells": [], "started_at": float("nan")},
        {"cells": []},  # no start time
    ],
)
def test_a_malformed_engine_answer_is_logged_and_skipped(
    malformed: object, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="vllm.tabletune.http"):
        seen = sync_rounds(
            [engine_answer(100.0, 5), malformed, engine_answer(100.0, 9)], CollectorRegistry()
        )
    assert seen == [(5, 100.0), (5, 100.0), (9, 100.0)]  # the last good reading stays
    assert "malformed step cells" in caplog.text


def test_step_cells_read_through_the_backend_match_the_engines_counter() -> None:
    engine = FakeEngineClient()
    timer = step_timer_of(engine.core.scheduler)
    timer.on_step(0.0, {"a": 2, "b": 2}, 4, {"a": [7], "b": [7]}, idle_after=False, drafts_next=1)
    timer.on_step(0.5, {"a": 2, "b": 2}, 4, {"a": [7], "b": [7]}, idle_after=False, drafts_next=1)
    read = asyncio.run(EngineUtilityBackend(engine.call_utility_async).get_step_cells())
    assert read.cells == timer.counter.totals() and read.started_at == timer.started_at
    assert read.steps_without_decode == 0


def test_the_step_cells_route_asks_the_engine_not_the_last_sync(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = FakeEngineClient()
    client, registry = make_app(monkeypatch, engine, token=None)  # reads open without a token
    timer = step_timer_of(engine.core.scheduler)
    timer.on_step(0.0, {"a": 2, "b": 2}, 4, {"a": [7], "b": [7]}, idle_after=False, drafts_next=1)
    timer.on_step(0.5, {"a": 2, "b": 2}, 4, {"a": [7], "b": [7]}, idle_after=False, drafts_next=1)
    response = client.get(STEP_CELLS_PATH)
    assert response.status_code == 200, response.text
    assert engine.calls == [(wire.GET_STEP_CELLS, ())]  # no sync ran (interval 0): asked now
    read = StepCellsRead.from_wire(response.json())
    assert read.cells == timer.counter.totals() and read.started_at == timer.started_at
    timer.on_step(0.7, {"a": 2, "b": 2}, 4, {"a": [7], "b": [7]}, idle_after=False, drafts_next=1)
    again = StepCellsRead.from_wire(client.get(STEP_CELLS_PATH).json())
    assert again.cells[(1, 2, 2)].steps == 2  # the step just finished is in
    exported = registry.get_sample_value(
        "tabletune_steps_total", {"model_name": "qwen3-4b", "engine": "0", "k": "1", "batch": "2"}
    )
    assert exported == 2  # what the route read is published too, as a sync's read is


def test_the_step_cells_route_relays_engine_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    client, _ = make_app(monkeypatch, FakeEngineClient(fail=True))
    response = client.get(STEP_CELLS_PATH, headers=AUTH)
    assert response.status_code == 503 and "tabletune_engine" in response.json()["detail"]
    engine = FakeEngineClient()
    setattr(engine.core.scheduler, TIMER_ATTR, SimpleNamespace(to_wire=lambda: {"cells": 1}))
    client, _ = make_app(monkeypatch, engine)
    response = client.get(STEP_CELLS_PATH, headers=AUTH)
    assert response.status_code == 502 and "malformed step cells" in response.json()["detail"]


def test_the_sync_loop_runs_every_second_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    intervals: list[float] = []

    async def fake_sync(backend: EngineUtilityBackend, *, interval_s: float) -> None:
        intervals.append(interval_s)

    monkeypatch.setattr(http_module, "sync_views", fake_sync)
    monkeypatch.delenv("TABLETUNE_SYNC_INTERVAL_S", raising=False)
    plugin = TableTuneEndpoint(metrics=TableTuneMetrics(CollectorRegistry()))

    async def start() -> None:
        state = Namespace()
        await plugin.init_state(FakeEngineClient(), state, Namespace())
        await state.tabletune_sync_task

    asyncio.run(start())
    assert intervals == [1.0]
