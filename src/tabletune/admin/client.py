"""A small synchronous client for the admin API (daemon, profiler, benchmarks).

Errors are TableTune's own: ``TemporaryError`` for connection problems and 5xx (worth a retry),
``AdminRefused`` (a ``PermanentError`` with the status) for 4xx. Retries are the caller's job,
at its I/O edge.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from tabletune import __version__
from tabletune.admin.protocol import (
    SETTINGS_PATH,
    STEP_CELLS_FIELD,
    STEP_CELLS_PATH,
    TABLE_PATH,
    EngineIdentity,
    SettingsPut,
    StepCellsRead,
    TablePut,
    TableView,
    describe_problems,
)
from tabletune.admin.state import AdminError, TableState
from tabletune.errors import PermanentError, TemporaryError

Body = TypeVar("Body", bound=BaseModel)


class AdminRefused(PermanentError):
    """The engine refused the request (4xx); retrying the same request will not help."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class ConditionalPut:
    """A conditional table PUT's answer: whether the table was swapped (200) or the cell held
    too few steps (412, nothing changed), and the step cells it was decided on."""

    swapped: bool
    step_cells: StepCellsRead
    view: TableView | None  # the new view when swapped


def settings_body(**fields: int | list[int] | None) -> dict[str, int | list[int]]:
    """The PUT settings body: the fields given (omitted ones stay as they are)."""
    return {name: value for name, value in fields.items() if value is not None}


class AdminClient:
    """Talks to one engine's ``/tabletune/v1`` endpoints.

    With ``http`` given, requests go through that shared ``httpx.Client`` (one connection pool
    for many engines: the daemon's) and ``close`` leaves it open; otherwise the client owns
    one of its own.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._owned = http is None
        self._http = http or httpx.Client(timeout=timeout_s, transport=transport)

    def close(self) -> None:
        if self._owned:
            self._http.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        json: object = None,
        headers: dict[str, str] | None = None,
    ) -> TableView:
        response = self._send(method, path, json=json, headers=headers)
        try:
            return TableView.model_validate(response.json())
        except ValueError as error:
            raise TemporaryError(f"{self.base_url}{path}: malformed answer: {error}") from None

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: object,
        headers: dict[str, str] | None,
        answered: frozenset[int] = frozenset(),
    ) -> httpx.Response:
        """The answer of a request that was not refused (TemporaryError, AdminRefused), or one
        whose status is in ``answered``."""
        url = f"{self.base_url}{path}"
        try:
            response = self._http.request(
                method, url, json=json, headers={**self._headers, **(headers or {})}
            )
        except httpx.HTTPError as error:
            raise TemporaryError(
                f"{self.base_url}{path}: {type(error).__name__}: {error}"
            ) from None
        if response.status_code >= 500:
            raise TemporaryError(
                f"{self.base_url}{path}: HTTP {response.status_code}: {response.text[:200]}"
            )
        if response.status_code >= 400 and response.status_code not in answered:
            try:
                detail = str(response.json().get("detail", response.text))
            except ValueError:
                detail = response.text[:200]
            raise AdminRefused(response.status_code, detail)
        return response

    def get_table(self) -> TableView:
        return self._call("GET", TABLE_PATH)

    def get_step_cells(self) -> StepCellsRead:
        """The engine's step cells as of its last finished step (``AdminRefused`` 404: a
        server without the route, an older plugin)."""
        response = self._send("GET", STEP_CELLS_PATH, json=None, headers=None)
        try:
            return StepCellsRead.from_wire(response.json())
        except ValueError as error:
            raise TemporaryError(
                f"{self.base_url}{STEP_CELLS_PATH}: malformed answer: {error}"
            ) from None

    def put_table(
        self,
        table: Sequence[Sequence[int]],
        *,
        if_match: int | None = None,
        allow_uncaptured: bool = False,
    ) -> TableView:
        headers = {} if if_match is None else {"If-Match": f'"{if_match}"'}
        body = {"table": [list(r) for r in table], "allow_uncaptured": allow_uncaptured}
        return self._call("PUT", TABLE_PATH, json=body, headers=headers)

    def put_table_when(
        self,
        table: Sequence[Sequence[int]],
        *,
        k: int,
        batch_size: int,
        at_least: int,
        if_match: int | None = None,
    ) -> ConditionalPut:
        """``table`` if the step cell of ``k`` and ``batch_size`` holds ``at_least`` steps, decided
        between two engine steps; either way the step cells read then. A server from before
        the condition refuses the field: ``AdminRefused`` 422 naming ``when_cell_steps``."""
        headers = {} if if_match is None else {"If-Match": f'"{if_match}"'}
        when = {"k": k, "batch_size": batch_size, "at_least": at_least}
        body = {"table": [list(r) for r in table], "when_cell_steps": when}
        response = self._send(
            "PUT", TABLE_PATH, json=body, headers=headers, answered=frozenset({412})
        )
        try:
            data = response.json()
            cells = StepCellsRead.from_wire(data.get(STEP_CELLS_FIELD))
            swapped = response.status_code == 200
            return ConditionalPut(
                swapped, cells, TableView.model_validate(data) if swapped else None
            )
        except (ValueError, AttributeError) as error:
            raise TemporaryError(
                f"{self.base_url}{TABLE_PATH}: malformed answer: {error}"
            ) from None

    def put_settings(
        self,
        *,
        exploration_interval: int | None = None,
        hysteresis: int | None = None,
        neighbour_interval: int | None = None,
        neighbour_burst: int | None = None,
        neighbour_ks: list[int] | None = None,
        if_match: int | None = None,
    ) -> TableView:
        headers = {} if if_match is None else {"If-Match": f'"{if_match}"'}
        body = settings_body(
            exploration_interval=exploration_interval,
            hysteresis=hysteresis,
            neighbour_interval=neighbour_interval,
            neighbour_burst=neighbour_burst,
            neighbour_ks=neighbour_ks,
        )
        return self._call("PUT", SETTINGS_PATH, json=body, headers=headers)


AdminRequest = TablePut | SettingsPut | None
"""A request to an in-process admin side: a table PUT, a settings PUT, or None for GET."""


class InProcessAdmin(ABC):
    """``AdminClient``'s interface over an admin side in this process (no HTTP). The bodies are
    built and validated here, once, as the plugin validates them (a bad one is a 422
    ``AdminRefused``); a subclass only answers them (``answer``)."""

    def get_table(self) -> TableView:
        return self.answer(None, None)

    def put_table(
        self,
        table: Sequence[Sequence[int]],
        *,
        if_match: int | None = None,
        allow_uncaptured: bool = False,
    ) -> TableView:
        rows = [list(r) for r in table]
        body = _validated(TablePut, {"table": rows, "allow_uncaptured": allow_uncaptured})
        return self.answer(body, if_match)

    def put_settings(
        self, *, if_match: int | None = None, **fields: int | list[int] | None
    ) -> TableView:
        return self.answer(_validated(SettingsPut, settings_body(**fields)), if_match)

    @abstractmethod
    def answer(self, request: AdminRequest, if_match: int | None) -> TableView:
        """The view after ``request``; AdminRefused (4xx) or TemporaryError (5xx) otherwise."""


def _validated(model: type[Body], body: Mapping[str, object]) -> Body:
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise AdminRefused(422, describe_problems(error)) from None


IN_PROCESS_ENGINE = EngineIdentity("0.26.0")
"""What a ``StateAdminClient`` reports unless told: the vLLM release TableTune runs on."""


class StateAdminClient(InProcessAdmin):
    """An in-process admin side over a ``TableState``: the real state transitions, for
    benchmarks and tests that drive the daemon in process."""

    def __init__(self, state: TableState, *, identity: EngineIdentity = IN_PROCESS_ENGINE) -> None:
        self.state = state
        self.identity = identity

    def answer(self, request: AdminRequest, if_match: int | None) -> TableView:
        try:
            if isinstance(request, TablePut):
                self.state = self.state.with_table(request, if_match=if_match)
            elif isinstance(request, SettingsPut):
                self.state = self.state.with_settings(request, if_match=if_match)
        except AdminError as error:
            raise AdminRefused(error.status, error.detail) from None
        return self.state.view(plugin_version=__version__, identity=self.identity)
