"""Library exceptions never leak out of the daemon's I/O edges: they become TableTune errors
(or per-replica problems) the controller knows how to handle."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import requests

from tabletune.daemon.alerts import AlertmanagerClient
from tabletune.daemon.direct_source import DirectSource
from tabletune.daemon.prometheus_source import PrometheusSource
from tabletune.daemon.settings import load_settings
from tabletune.errors import TemporaryError


def refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def test_direct_source_turns_http_errors_into_problems() -> None:
    settings = load_settings({}).source
    source = DirectSource(
        settings=settings, replicas=["http://r1"], transport=httpx.MockTransport(refuse)
    )
    result = source.collect(0.0)
    assert "ConnectError" in result.problems["http://r1"]


def test_direct_source_garbage_is_a_problem_not_a_crash() -> None:
    def garbage(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text='vllm:generation_tokens_total{engine="0" 1\n')

    source = DirectSource(
        settings=load_settings({}).source,
        replicas=["http://r1"],
        transport=httpx.MockTransport(garbage),
    )
    assert "unreadable" in source.collect(0.0).problems["http://r1"]


class BrokenApi:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        raise self.error


@pytest.mark.parametrize(
    "error", [requests.ConnectionError("refused"), ValueError("bad json"), KeyError("data")]
)
def test_prometheus_failures_are_temporary_errors(error: Exception) -> None:
    settings = load_settings({"TABLETUNE_SOURCE__PROMETHEUS_URL": "http://prom:9090"}).source
    source = PrometheusSource(settings=settings, api=BrokenApi(error))
    with pytest.raises(TemporaryError, match="Prometheus query failed"):
        source.collect(1000.0)


def test_alertmanager_connection_errors_are_temporary() -> None:
    settings = load_settings({"TABLETUNE_ALERTS__ALERTMANAGER_URL": "http://am:9093"}).alerts
    client = AlertmanagerClient(settings=settings, transport=httpx.MockTransport(refuse))
    with pytest.raises(TemporaryError, match="ConnectError"):
        client.post([])
