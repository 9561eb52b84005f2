"""The HTTP side's ``AdminBackend``: forwards each request to the engine-core process. Pure.

``call`` is ``engine_client.engine_core.call_utility_async`` in vLLM; tests pass a fake that
records calls. Validation happens in the engine (one authority); this side only relays.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tabletune.admin.protocol import (
    SettingsPut,
    StepCellsRead,
    TableAnswer,
    TablePut,
    TableView,
)
from tabletune.admin.state import AdminError, CellNotFull
from tabletune.plugin.wire import (
    GET_STEP_CELLS,
    GET_TABLE,
    PUT_SETTINGS,
    PUT_TABLE,
    answer_from_envelope,
    step_cells_from_answer,
    view_from_envelope,
)

UtilityCall = Callable[..., Awaitable[Any]]
ViewListener = Callable[[TableView], None]
StepsListener = Callable[[StepCellsRead], None]

LOGGER = logging.getLogger("vllm.tabletune.http")


class EngineUtilityBackend:
    """Calls the engine side's utility methods; every answer's view goes to ``on_view``, every
    step-cell read to ``on_steps``."""

    def __init__(
        self,
        call: UtilityCall,
        *,
        on_view: ViewListener | None = None,
        on_steps: StepsListener | None = None,
    ) -> None:
        self._call = call
        self._on_view = on_view
        self._on_steps = on_steps

    async def get_view(self) -> TableView:
        return await self._invoke(GET_TABLE)

    async def put_table(self, body: TablePut, if_match: int | None) -> TableAnswer:
        """``when_cell_steps`` travels only when set: an engine side from before it (a plugin
        half-upgraded) refuses an unknown field, as the HTTP side does."""
        try:
            answer = answer_from_envelope(
                await self._ask(PUT_TABLE, body.model_dump(exclude_none=True), if_match)
            )
        except CellNotFull as refused:
            self._heard(None, refused.step_cells)
            raise
        self._heard(answer.view, answer.step_cells)
        return answer

    async def put_settings(self, body: SettingsPut, if_match: int | None) -> TableView:
        return await self._invoke(PUT_SETTINGS, body.model_dump(exclude_none=True), if_match)

    async def get_step_cells(self) -> StepCellsRead:
        read = step_cells_from_answer(await self._ask(GET_STEP_CELLS))
        self._heard(None, read)
        return read

    async def _invoke(self, name: str, *args: object) -> TableView:
        view = view_from_envelope(await self._ask(name, *args))
        self._heard(view, None)
        return view

    def _heard(self, view: TableView | None, read: StepCellsRead | None) -> None:
        if view is not None and self._on_view is not None:
            self._on_view(view)
        if read is not None and self._on_steps is not None:
            self._on_steps(read)

    async def _ask(self, name: str, *args: object) -> object:
        try:
            return await self._call(name, *args)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # vLLM raises a bare Exception for a failed utility call
            raise AdminError(
                503,
                f"engine did not answer {name} ({error}); is tabletune_engine in VLLM_PLUGINS?",
            ) from None


async def sync_views(
    backend: EngineUtilityBackend,
    *,
    interval_s: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    max_rounds: int | None = None,
) -> None:
    """Read the engine's view and step cells every ``interval_s`` so the gauges, the exploration
    counters and the step cells follow the engine even when nobody calls the API. A failed or
    malformed read is logged and skipped; the loop goes on."""
    rounds = 0
    while max_rounds is None or rounds < max_rounds:
        rounds += 1
        for read in (backend.get_view, backend.get_step_cells):
            try:
                await read()
            except AdminError as error:
                # 502: the engine answered nonsense (a bug worth seeing); else it did not answer.
                level = logging.WARNING if error.status == 502 else logging.DEBUG
                LOGGER.log(
                    level, "tabletune: engine not read: HTTP %s %s", error.status, error.detail
                )
        await sleep(interval_s)
