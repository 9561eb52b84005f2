"""What travels between the API-server process and the engine-core process. Pure.

The HTTP side calls ``engine_client.engine_core.call_utility_async(name, *args)``; the engine
side answers with a plain dict (msgpack-safe) that carries either the new view or the refusal,
so a 409/412/422 decided in the engine reaches the client with its status and reason intact
(vLLM would turn a raised exception into a bare failure string); a conditional table PUT's
answer, accepted or 412, adds the step cells it was decided on.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from tabletune.admin.protocol import STEP_CELLS_FIELD, StepCellsRead, TableAnswer, TableView
from tabletune.admin.state import AdminError, CellNotFull

# EngineCore methods added by the engine side (tabletune.plugin.engine).
GET_TABLE = "tabletune_get_table"
PUT_TABLE = "tabletune_put_table"
PUT_SETTINGS = "tabletune_put_settings"
GET_STEP_CELLS = "tabletune_get_step_cells"


def ok_envelope(view: TableView, step_cells: StepCellsRead | None = None) -> dict[str, Any]:
    envelope = {"status": 200, "view": view.model_dump()}
    return envelope if step_cells is None else {**envelope, STEP_CELLS_FIELD: step_cells.to_wire()}


def error_envelope(error: AdminError) -> dict[str, Any]:
    envelope = {"status": error.status, "detail": error.detail}
    if isinstance(error, CellNotFull):
        return {**envelope, STEP_CELLS_FIELD: error.step_cells.to_wire()}
    return envelope


def view_from_envelope(envelope: object) -> TableView:
    """The view inside an engine answer; raises the engine's refusal as ``AdminError``."""
    return answer_from_envelope(envelope).view


def answer_from_envelope(envelope: object) -> TableAnswer:
    """The view and step cells (if any) inside an engine answer; raises the engine's refusal
    as ``AdminError`` (``CellNotFull`` with its step cells for a 412)."""
    if not isinstance(envelope, dict) or not isinstance(envelope.get("status"), int):
        raise AdminError(502, f"malformed answer from the engine: {envelope!r:.200}")
    status: int = envelope["status"]
    cells = (
        None
        if STEP_CELLS_FIELD not in envelope
        else step_cells_from_answer(envelope[STEP_CELLS_FIELD])
    )
    if status != 200:
        detail = str(envelope.get("detail", "refused by the engine"))
        if status == 412 and cells is not None:
            raise CellNotFull(detail, cells)
        raise AdminError(status, detail)
    try:
        return TableAnswer(TableView.model_validate(envelope.get("view")), cells)
    except ValidationError as error:
        raise AdminError(502, f"malformed view from the engine: {error}") from None


def step_cells_from_answer(answer: object) -> StepCellsRead:
    """The step cells in an engine answer (``StepTimer.to_wire``); 502 when malformed."""
    try:
        return StepCellsRead.from_wire(answer)
    except ValueError as error:
        raise AdminError(502, f"malformed step cells from the engine: {error}") from None
