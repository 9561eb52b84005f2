"""HTTP routes of the admin API, shared by the vLLM endpoint plugin and the emulator.

``build_router`` only registers routes; the engine behind them is a ``AdminBackend`` found per
request (None -> 503). Every refusal leaves the table as it was.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from typing import Any, Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from tabletune.admin.protocol import (
    MAX_BODY_BYTES,
    SETTINGS_PATH,
    TABLE_PATH,
    SettingsPut,
    TablePut,
    TableView,
    describe_problems,
)
from tabletune.admin.state import AdminError, parse_if_match


class AdminBackend(Protocol):
    """The engine side: reads and changes one engine's table state atomically."""

    async def get_view(self) -> TableView: ...

    async def put_table(self, body: TablePut, if_match: int | None) -> TableView: ...

    async def put_settings(self, body: SettingsPut, if_match: int | None) -> TableView: ...


BackendGetter = Callable[[Request], AdminBackend | None]


def _error(status: int, detail: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": detail})


def _view_response(view: TableView) -> JSONResponse:
    return JSONResponse(content=view.model_dump(), headers={"ETag": f'"{view.version}"'})


async def _parse_body(request: Request, model: type[BaseModel]) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise AdminError(413, f"body larger than {MAX_BODY_BYTES} bytes")
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise AdminError(413, f"body larger than {MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise AdminError(400, f"body is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise AdminError(422, "body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise AdminError(422, describe_problems(error)) from None


def check_token(request: Request, token: str | None) -> None:
    """Bearer token auth when a token is configured (constant-time compare)."""
    if not token:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), token.encode()
    ):
        raise AdminError(401, "missing or wrong admin token (Authorization: Bearer <token>)")


def build_router(get_backend: BackendGetter, *, token: str | None) -> APIRouter:
    """Routes for GET/PUT table and settings; ``token`` enables auth on every route."""
    router = APIRouter()

    async def guarded(request: Request, action: Callable[[AdminBackend], Any]) -> JSONResponse:
        try:
            check_token(request, token)
            backend = get_backend(request)
            if backend is None:
                return _error(503, "no engine attached")
            view = await action(backend)
        except AdminError as error:
            return _error(error.status, error.detail)
        return _view_response(view)

    @router.get(TABLE_PATH)
    async def get_table(request: Request) -> JSONResponse:
        return await guarded(request, lambda backend: backend.get_view())

    @router.get(SETTINGS_PATH)
    async def get_settings(request: Request) -> JSONResponse:
        return await guarded(request, lambda backend: backend.get_view())

    @router.put(TABLE_PATH)
    async def put_table(request: Request) -> JSONResponse:
        async def act(backend: AdminBackend) -> TableView:
            if_match = parse_if_match(request.headers.get("if-match"))
            body = await _parse_body(request, TablePut)
            return await backend.put_table(body, if_match)

        return await guarded(request, act)

    @router.put(SETTINGS_PATH)
    async def put_settings(request: Request) -> JSONResponse:
        async def act(backend: AdminBackend) -> TableView:
            if_match = parse_if_match(request.headers.get("if-match"))
            body = await _parse_body(request, SettingsPut)
            return await backend.put_settings(body, if_match)

        return await guarded(request, act)

    return router
