"""The HTTP face of one or many emulated engines: the routes vLLM-with-plugin serves
(``/metrics``, ``/health``, ``/version``, ``/v1/models``, the admin API from
``tabletune.admin.router``) and the emulator's own (``/sim/v1/...``: truth, faults, load,
acceptance, restart).

One app serves every replica; the replica is the one listening on the port the request came in
on (``scope["server"]``), so N replicas look like N separate vLLM servers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tabletune.admin.auth import AdminAuth
from tabletune.admin.router import AdminBackend, install_admin_api
from tabletune.sim.faults import FaultsPatch
from tabletune.sim.replica import Replica, Unavailable

SIM_PREFIX = "/sim/v1"


class ReplicaSet:
    """Replicas by local port; with one replica, every request goes to it (tests, proxies)."""

    def __init__(self, replicas: Mapping[int, Replica]) -> None:
        if not replicas:
            raise ValueError("at least one replica")
        self.by_port = dict(replicas)
        self._only = next(iter(self.by_port.values())) if len(self.by_port) == 1 else None

    def for_request(self, request: Request) -> Replica | None:
        if self._only is not None:
            return self._only
        server = request.scope.get("server")
        return self.by_port.get(server[1]) if server else None


class LoadPut(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch_size: int = Field(ge=0)


class AcceptancePut(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rates: list[float] = Field(min_length=1)


class RestartPost(BaseModel):
    model_config = ConfigDict(extra="forbid")
    downtime_s: float = Field(default=0.0, ge=0)


def _not_found() -> JSONResponse:
    return JSONResponse(status_code=404, content={"detail": "no replica on this port"})


async def _body(request: Request, model: type[BaseModel]) -> Any:
    try:
        return model.model_validate_json(await request.body() or b"{}")
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ValueError(f"{where}: {first['msg']}") from None


def sim_router(replicas: ReplicaSet) -> APIRouter:
    router = APIRouter()

    @router.get("/metrics")
    async def metrics(request: Request) -> Response:
        replica = replicas.for_request(request)
        if replica is None:
            return _not_found()
        try:
            body = await replica.metrics_text()
        except Unavailable as reason:
            return PlainTextResponse(str(reason), status_code=503)
        return Response(content=body, media_type=CONTENT_TYPE_LATEST)

    @router.get("/health")
    async def health(request: Request) -> Response:
        replica = replicas.for_request(request)
        if replica is None:
            return _not_found()
        replica.sync()
        return Response(status_code=503 if replica.down else 200)

    @router.get("/version")
    async def version(request: Request) -> Response:
        replica = replicas.for_request(request)
        if replica is None:
            return _not_found()
        return JSONResponse({"version": replica.scenario.engine.engine_version})

    @router.get("/v1/models")
    async def models(request: Request) -> Response:
        replica = replicas.for_request(request)
        if replica is None:
            return _not_found()
        name = replica.scenario.engine.model_name
        return JSONResponse(
            {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "vllm"}]}
        )

    @router.get(f"{SIM_PREFIX}/truth")
    async def truth(request: Request, last: int = 60) -> Response:
        replica = replicas.for_request(request)
        if replica is None:
            return _not_found()
        return JSONResponse(replica.truth(last=last))

    @router.get(f"{SIM_PREFIX}/faults")
    async def get_faults(request: Request) -> Response:
        replica = replicas.for_request(request)
        if replica is None:
            return _not_found()
        now = replica.sync()
        faults = replica.faults
        return JSONResponse(
            {
                **faults.manual.model_dump(),
                "active": {  # manual and scheduled together, at the current simulated time
                    "admin_error_status": faults.admin_error(now),
                    "admin_latency_s": faults.admin_latency_s(now),
                    "metrics_outage": faults.metrics_outage(now),
                    "metrics_delay_s": faults.scrape_delay_s(now),
                    "down": replica.down,
                },
            }
        )

    async def control(request: Request, model: type[BaseModel], action: Any) -> Response:
        replica = replicas.for_request(request)
        if replica is None:
            return _not_found()
        try:
            body = await _body(request, model)
            result = action(replica, body)
        except ValueError as error:
            return JSONResponse(status_code=422, content={"detail": str(error)})
        return JSONResponse(result)

    @router.post(f"{SIM_PREFIX}/faults")
    async def post_faults(request: Request) -> Response:
        def act(replica: Replica, body: FaultsPatch) -> dict[str, Any]:
            replica.sync()
            replica.faults.manual = body.apply(replica.faults.manual)
            return replica.faults.manual.model_dump()

        return await control(request, FaultsPatch, act)

    @router.post(f"{SIM_PREFIX}/load")
    async def post_load(request: Request) -> Response:
        def act(replica: Replica, body: LoadPut) -> dict[str, Any]:
            replica.set_load(body.batch_size)
            return {"batch_size": body.batch_size, "from_s": replica.engine.now}

        return await control(request, LoadPut, act)

    @router.post(f"{SIM_PREFIX}/acceptance")
    async def post_acceptance(request: Request) -> Response:
        def act(replica: Replica, body: AcceptancePut) -> dict[str, Any]:
            replica.set_acceptance(body.rates)
            return {"rates": body.rates, "from_s": replica.engine.now}

        return await control(request, AcceptancePut, act)

    @router.post(f"{SIM_PREFIX}/restart")
    async def post_restart(request: Request) -> Response:
        def act(replica: Replica, body: RestartPost) -> dict[str, Any]:
            replica.sync()
            replica.restart(downtime_s=body.downtime_s)
            return {"restarts": replica.restarts, "down_until_s": replica.engine.down_until}

        return await control(request, RestartPost, act)

    return router


def build_app(replicas: ReplicaSet, *, auth: AdminAuth) -> FastAPI:
    """The app; the admin API is the plugin's (same routes, same ``auth`` rules)."""
    app = FastAPI(title="tabletune sim (vLLM 0.26 + TableTune plugin look-alike)")

    def backend(request: Request) -> AdminBackend | None:
        replica = replicas.for_request(request)
        return None if replica is None else replica.admin

    install_admin_api(app, backend, lambda request: auth)
    app.include_router(sim_router(replicas))
    return app
