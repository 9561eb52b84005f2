"""Fixtures that start real servers (Prometheus, Alertmanager) on free ports.

A missing binary skips the test locally and fails it when TABLETUNE_REQUIRE_SERVERS=1 (CI).

    def test_x(prometheus_factory, alertmanager_server):
        prom = prometheus_factory(["127.0.0.1:8000"], alertmanager=alertmanager_server.address)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import (
    AlertmanagerServer,
    PrometheusServer,
    alertmanager,
    free_port,
    prometheus,
)

PrometheusFactory = Callable[..., PrometheusServer]


@pytest.fixture
def unused_port() -> int:
    return free_port()


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[PrometheusFactory]:
    """``factory(targets, **options)`` starts a Prometheus (see ``servers.prometheus``);
    every one started is terminated at the end of the test."""
    with ExitStack() as stack:

        def start(targets: list[str] | tuple[str, ...] = (), **options: Any) -> PrometheusServer:
            return stack.enter_context(prometheus(tmp_path, targets, **options))

        yield start


@pytest.fixture
def alertmanager_server(tmp_path: Path) -> Iterator[AlertmanagerServer]:
    with alertmanager(tmp_path) as server:
        yield server
