"""HTTP routes of the admin API, shared by the vLLM endpoint plugin and the emulator.

``install_admin_api`` registers the routes and puts ``CrossOriginGuard`` outside every other
middleware of the app. The engine behind the routes is an ``AdminBackend`` found per request
(None -> 503), the access rules an ``AdminAuth`` (see ``tabletune.admin.auth``). Every refusal
is a 4xx with a one-line reason and leaves the table as it was.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from tabletune.admin.auth import AdminAuth, Caller, authorize, cross_origin_problem
from tabletune.admin.protocol import (
    API_PREFIX,
    MAX_BODY_BYTES,
    SETTINGS_PATH,
    STEP_CELLS_FIELD,
    STEP_CELLS_PATH,
    TABLE_PATH,
    SettingsPut,
    StepCellsRead,
    TableAnswer,
    TablePut,
    TableView,
    describe_problems,
)
from tabletune.admin.state import AdminError, CellNotFull, parse_if_match


class AdminBackend(Protocol):
    """The engine side: reads and changes one engine's table state atomically, and reads its
    step cells as of its last finished step (``AdminError`` 404 where none are counted)."""

    async def get_view(self) -> TableView: ...

    async def get_step_cells(self) -> StepCellsRead: ...

    async def put_table(self, body: TablePut, if_match: int | None) -> TableAnswer:
        """``CellNotFull`` (412, with its reading) when ``when_cell_steps`` does not hold."""

    async def put_settings(self, body: SettingsPut, if_match: int | None) -> TableView: ...


BackendGetter = Callable[[Request], AdminBackend | None]
AuthGetter = Callable[[Request], AdminAuth]
MAX_DETAIL_CHARS = 2000


def one_line(detail: str) -> str:
    """A reason may quote the request (a field name, a header): escape what is not printable
    (newlines, lone surrogates), so it stays one encodable line in every log, and cut it."""
    text = "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in detail[: MAX_DETAIL_CHARS + 1]
    )
    return text if len(text) <= MAX_DETAIL_CHARS else text[:MAX_DETAIL_CHARS] + "..."


def _error(status: int, detail: str, **extra: object) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    content = {"detail": one_line(detail), **extra}
    return JSONResponse(status_code=status, content=content, headers=headers)


def _view_response(view: TableView, **extra: object) -> JSONResponse:
    content = {**view.model_dump(), **extra}
    return JSONResponse(content=content, headers={"ETag": f'"{view.version}"'})


async def _read_body(request: Request) -> bytes:
    """The body, read as a stream and abandoned at the limit (a chunked body has no length)."""
    too_large = AdminError(413, f"body larger than {MAX_BODY_BYTES} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared[:20]) > MAX_BODY_BYTES:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise too_large
    return bytes(body)


def _parse_json(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except RecursionError:
        raise AdminError(400, "body is not valid JSON: nested too deeply") from None
    except UnicodeDecodeError:
        raise AdminError(400, "body is not valid JSON: not UTF-8") from None
    except json.JSONDecodeError as error:
        raise AdminError(400, f"body is not valid JSON: {error}") from None
    except ValueError:  # Python's limit on digits in an int (sys.get_int_max_str_digits)
        raise AdminError(400, "body is not valid JSON: a number has too many digits") from None


async def _parse_body(request: Request, model: type[BaseModel]) -> Any:
    data = _parse_json(await _read_body(request))
    if not isinstance(data, dict):
        raise AdminError(422, "body must be a JSON object")
    try:
        return model.model_validate(data)
    except RecursionError:
        raise AdminError(422, "body is nested too deeply") from None
    except ValidationError as error:
        raise AdminError(422, describe_problems(error)) from None


def _caller(request: Request, *, write: bool) -> Caller:
    return Caller(
        write=write,
        authorization=request.headers.get("authorization"),
        client_host=request.client.host if request.client else None,
        host=request.headers.get("host"),
    )


def _router(get_backend: BackendGetter, get_auth: AuthGetter) -> APIRouter:
    router = APIRouter()

    async def answered(
        request: Request,
        *,
        write: bool,
        respond: Callable[[AdminBackend], Awaitable[JSONResponse]],
    ) -> JSONResponse:
        try:
            authorize(get_auth(request), _caller(request, write=write))
            backend = get_backend(request)
            if backend is None:
                return _error(503, "no engine attached")
            return await respond(backend)
        except CellNotFull as error:
            return _error(
                error.status, error.detail, **{STEP_CELLS_FIELD: error.step_cells.to_wire()}
            )
        except AdminError as error:
            return _error(error.status, error.detail)

    async def guarded(
        request: Request, *, write: bool, action: Callable[[AdminBackend], Awaitable[TableView]]
    ) -> JSONResponse:
        async def respond(backend: AdminBackend) -> JSONResponse:
            return _view_response(await action(backend))

        return await answered(request, write=write, respond=respond)

    @router.get(TABLE_PATH)
    async def get_table(request: Request) -> JSONResponse:
        return await guarded(request, write=False, action=lambda backend: backend.get_view())

    @router.get(STEP_CELLS_PATH)
    async def get_step_cells(request: Request) -> JSONResponse:
        async def respond(backend: AdminBackend) -> JSONResponse:
            return JSONResponse(content=(await backend.get_step_cells()).to_wire())

        return await answered(request, write=False, respond=respond)

    @router.get(SETTINGS_PATH)
    async def get_settings(request: Request) -> JSONResponse:
        return await guarded(request, write=False, action=lambda backend: backend.get_view())

    @router.put(TABLE_PATH)
    async def put_table(request: Request) -> JSONResponse:
        async def respond(backend: AdminBackend) -> JSONResponse:
            if_match = parse_if_match(request.headers.get("if-match"))
            body = await _parse_body(request, TablePut)
            answer = await backend.put_table(body, if_match)
            read = answer.step_cells
            extra = {} if read is None else {STEP_CELLS_FIELD: read.to_wire()}
            return _view_response(answer.view, **extra)

        return await answered(request, write=True, respond=respond)

    @router.put(SETTINGS_PATH)
    async def put_settings(request: Request) -> JSONResponse:
        async def act(backend: AdminBackend) -> TableView:
            if_match = parse_if_match(request.headers.get("if-match"))
            body = await _parse_body(request, SettingsPut)
            return await backend.put_settings(body, if_match)

        return await guarded(request, write=True, action=act)

    return router


class CrossOriginGuard:
    """ASGI layer answering 403 to a browser's cross-origin request or CORS preflight to the
    admin API, outside vLLM's CORSMiddleware (``allow_origins=["*"]`` by default), so neither
    reaches a route nor gets an ``Access-Control-Allow-*`` header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = str(scope["path"]).removeprefix(str(scope.get("root_path", "")))
            if path.startswith(API_PREFIX):
                headers = Headers(scope=scope)
                problem = cross_origin_problem(
                    str(scope["method"]), headers.get("origin"), headers.get("host")
                )
                if problem is not None:
                    await _error(403, problem)(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def install_admin_api(app: FastAPI, get_backend: BackendGetter, get_auth: AuthGetter) -> None:
    """GET/PUT table and settings and GET step cells on ``app``, with ``CrossOriginGuard`` as
    its outermost layer.

    Middleware added later (vLLM adds CORS after attaching endpoint plugins) would wrap an
    ordinary middleware, so the guard wraps the stack the app builds at its first request."""
    app.include_router(_router(get_backend, get_auth))
    build_stack = app.build_middleware_stack

    def guarded_stack() -> ASGIApp:
        return CrossOriginGuard(build_stack())

    app.build_middleware_stack = guarded_stack  # type: ignore[method-assign]
