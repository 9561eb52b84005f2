"""Where ``EngineHttp`` reads the step cells: the admin API's step-cells route when the server
has it (as of the engine's last step), else /metrics from the first 404 on (an older plugin)."""

from __future__ import annotations

import json

import httpx
import pytest

from tabletune.admin.client import AdminRefused
from tabletune.admin.protocol import STEP_CELLS_PATH, StepCellsRead
from tabletune.profiler.engine import EngineHttp
from tabletune.profiler.settings import ConnectionSettings
from tabletune.profiler.step_reading import StepReading
from tabletune.step_cells import CellTotals
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
