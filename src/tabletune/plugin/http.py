"""The ``vllm.endpoint_plugins`` entry point (``tabletune_http``): the admin API in vLLM's server.

vLLM 0.26's ``EndpointPlugin`` protocol: ``attach_router(app)`` only registers routes (at
``build_app``), ``init_state(engine_client, state, args)`` only prepares state (at
``init_app_state``). Routes find the backend on ``app.state`` per request: none -> 503.
Endpoint plugins are opt-in: vLLM loads this only when ``tabletune_http`` is in VLLM_PLUGINS.
No vLLM import needed: the engine client is used through ``engine_core.call_utility_async``.

Access (``tabletune.admin.auth``) is decided in ``init_state``, which sees vLLM's args: its
``--api-key`` (or ``VLLM_API_KEY``), which vLLM checks only under /v1, /v2 and /inference, is
accepted as an admin token too. Until then every request is refused.
"""

from __future__ import annotations

import asyncio
import logging
import os
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request

from tabletune.admin.auth import VLLM_API_KEY_ENV, AdminAuth, auth_from_env
from tabletune.admin.router import AdminBackend, install_admin_api
from tabletune.plugin.engine_backend import EngineUtilityBackend, sync_views
from tabletune.plugin.metrics_core import TableTuneMetrics

LOGGER = logging.getLogger("vllm.tabletune.http")
SYNC_ENV = "TABLETUNE_SYNC_INTERVAL_S"
DEFAULT_SYNC_INTERVAL_S = "1"  # how fresh the exported step cells are (one small call a second)
STATE_BACKEND = "tabletune_backend"
STATE_SYNC_TASK = "tabletune_sync_task"
STATE_AUTH = "tabletune_auth"
NOT_READY = AdminAuth(closed="the plugin's init_state has not run")


def backend_of(request: Request) -> AdminBackend | None:
    backend: AdminBackend | None = getattr(request.app.state, STATE_BACKEND, None)
    return backend


def auth_of(request: Request) -> AdminAuth:
    auth: AdminAuth = getattr(request.app.state, STATE_AUTH, NOT_READY)
    return auth


def vllm_api_keys(args: Namespace, env: Mapping[str, str]) -> list[str]:
    """The keys vLLM's own middleware accepts: ``--api-key`` wins over ``VLLM_API_KEY``."""
    return [key for key in (getattr(args, "api_key", None) or [env.get(VLLM_API_KEY_ENV)]) if key]


class TableTuneEndpoint:
    """GET/PUT ``/tabletune/v1/table`` and ``/tabletune/v1/settings``, GET
    ``/tabletune/v1/step-cells`` on vLLM's API server."""

    name = "tabletune_http"
    required_tasks: tuple[str, ...] | None = None  # no engine (render server) -> 503

    def __init__(self, *, metrics: TableTuneMetrics | None = None) -> None:
        self._metrics = metrics

    def attach_router(self, app: FastAPI) -> None:
        install_admin_api(app, backend_of, auth_of)

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        auth = auth_from_env(os.environ, api_keys=vllm_api_keys(args, os.environ))
        setattr(state, STATE_AUTH, auth)
        log = LOGGER.error if auth.closed else LOGGER.info
        log("tabletune: admin API: %s", auth.describe())
        if engine_client is None:
            setattr(state, STATE_BACKEND, None)
            return
        metrics = self._metrics or TableTuneMetrics.shared()
        model_name = str(engine_client.vllm_config.model_config.served_model_name)
        # The API server talks to engine 0 (vLLM answers utility calls from the first engine).
        engine_metrics = metrics.for_engine(model_name=model_name, engine="0")
        backend = EngineUtilityBackend(
            engine_client.engine_core.call_utility_async,
            on_view=engine_metrics.publish_view,
            on_steps=engine_metrics.publish_steps,
        )
        setattr(state, STATE_BACKEND, backend)
        interval = float(os.environ.get(SYNC_ENV, DEFAULT_SYNC_INTERVAL_S))
        if interval > 0:
            task = asyncio.get_running_loop().create_task(
                sync_views(backend, interval_s=interval), name="tabletune-sync"
            )
            setattr(state, STATE_SYNC_TASK, task)  # keep a reference (tasks are weakly held)
