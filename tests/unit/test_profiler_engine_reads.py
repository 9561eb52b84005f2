"""Where ``EngineHttp`` reads the step cells: the admin API's step-cells route when the server
has it (as of the engine's last step), else /metrics from the first 404 on (an older plugin)."""

from __future__ import annotations

import json

import httpx
import pytest

from tabletune.admin.auth import TOKEN_ENV
from tabletune.admin.client import AdminRefused
from tabletune.admin.protocol import STEP_CELLS_PATH, TABLE_PATH, StepCellsRead
from tabletune.profiler.engine import EngineHttp
from tabletune.profiler.settings import ConnectionSettings
from tabletune.profiler.step_reading import StepReading
from tabletune.step_cells import CellTotals
from tests.support.admin_apps import TOKEN, count_steps, plugin_app
from tests.unit.profiler_stepper import metrics_text

CELLS = {(2, 5, 5): CellTotals(4.0, 0.04, 0.0004, 60.0, 20.0)}
READ = StepCellsRead(CELLS, 3.0, 1.7e9, switch_steps=2.0, switch_seconds=0.02)
ON_METRICS = StepReading({(1, 5, 5): CellTotals(9.0, 0.09, 0.0009, 90.0, 45.0)}, 1.0, 5.0)


def serving(route_status: int) -> tuple[EngineHttp, list[str]]:
    paths: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if request.url.path == STEP_CELLS_PATH:
            if route_status == 200:
                return httpx.Response(200, json=READ.to_wire())
            return httpx.Response(route_status, json={"detail": "Not Found"})
        if request.url.path == "/metrics":
            return httpx.Response(200, text=metrics_text(ON_METRICS))
        return httpx.Response(500)

    settings = ConnectionSettings(retry_backoffs_s=())
    engine = EngineHttp(
        "http://vllm:8000", settings=settings, transport=httpx.MockTransport(answer)
    )
    return engine, paths


def test_the_route_is_read_when_the_server_has_it() -> None:
    engine, paths = serving(200)
    for _ in range(3):
        assert engine.step_reading() == StepReading(CELLS, 3.0, 2.0)
    assert engine.readings_fresh
    assert paths == [STEP_CELLS_PATH] * 3  # never /metrics


def test_without_the_route_metrics_is_read_from_the_first_404_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine, paths = serving(404)
    with caplog.at_level("INFO", logger="tabletune.profiler"):
        readings = [engine.step_reading() for _ in range(3)]
    assert readings == [ON_METRICS] * 3 and not engine.readings_fresh
    assert paths == [STEP_CELLS_PATH, "/metrics", "/metrics", "/metrics"]
    assert "reading step cells from /metrics" in caplog.text


def test_a_refused_read_is_an_error_not_a_fallback() -> None:
    engine, paths = serving(401)
    with pytest.raises(AdminRefused, match="401"):
        engine.step_reading()
    assert paths == [STEP_CELLS_PATH] and not engine.readings_fresh


def test_a_malformed_answer_is_retried_as_temporary() -> None:
    answers = iter([{"cells": "no"}, READ.to_wire()])

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=json.dumps(next(answers)))

    settings = ConnectionSettings(retry_backoffs_s=(0.0,))
    engine = EngineHttp(
        "http://vllm:8000",
        settings=settings,
        transport=httpx.MockTransport(answer),
        sleep=lambda s: None,
    )
    assert engine.step_reading().cells == CELLS


def test_a_conditional_switch_reads_and_sets_k_in_one_call_to_the_plugin() -> None:
    app = plugin_app({TOKEN_ENV: TOKEN})
    assert app.timer is not None
    count_steps(app.timer, batch=5, k=3, steps=8)
    client = app.client()
    calls: list[str] = []

    def forward(request: httpx.Request) -> httpx.Response:  # to the plugin's real routes
        calls.append(request.method)
        answer = client.request(
            request.method, request.url.path, content=request.content, headers=request.headers
        )
        return httpx.Response(answer.status_code, content=answer.content)

    settings = ConnectionSettings(retry_backoffs_s=(), admin_token=TOKEN)
    engine = EngineHttp(
        "http://vllm:8000", settings=settings, transport=httpx.MockTransport(forward)
    )
    answer = engine.switch_k_when_full(1, 256, cell=(3, 5), at_least=9)
    assert answer is not None
    reading, switched = answer
    assert switched is False and app.state().version == 0
    assert reading == StepReading({(3, 5, 5): app.timer.read().cells[(3, 5, 5)]}, 0, 0)
    assert engine.switch_k_when_full(1, 256, cell=(3, 5), at_least=8) == (reading, True)
    assert app.state().ranges == ((1, 256, 1),) and calls == ["PUT", "PUT"]


def test_an_older_plugin_is_detected_once_and_read_then_switched(
    caplog: pytest.LogCaptureFixture,
) -> None:
    puts: list[object] = []

    def older(request: httpx.Request) -> httpx.Response:  # TablePut forbids unknown fields
        puts.append(json.loads(request.content))
        detail = "when_cell_steps: Extra inputs are not permitted"
        return httpx.Response(422, json={"detail": detail})

    settings = ConnectionSettings(retry_backoffs_s=())
    engine = EngineHttp("http://vllm:8000", settings=settings, transport=httpx.MockTransport(older))
    with caplog.at_level("INFO", logger="tabletune.profiler"):
        for _ in range(3):
            assert engine.switch_k_when_full(1, 8, cell=(3, 5), at_least=9) is None
    assert len(puts) == 1 and caplog.text.count("takes no conditional table PUT") == 1


def test_any_other_refusal_of_a_conditional_switch_is_an_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        assert request.url.path == TABLE_PATH
        return httpx.Response(422, json={"detail": "table: k 9 exceeds K=3"})

    settings = ConnectionSettings(retry_backoffs_s=())
    engine = EngineHttp(
        "http://vllm:8000", settings=settings, transport=httpx.MockTransport(refuse)
    )
    with pytest.raises(AdminRefused, match="422"):
        engine.switch_k_when_full(9, 8, cell=(3, 5), at_least=9)
