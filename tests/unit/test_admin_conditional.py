"""The conditional table PUT (``when_cell_steps``): the table is swapped only if a step cell
holds the steps asked, decided on one reading of the step cells between two engine steps, and
either answer carries that reading; the usual rules come first; bad input is a 422 that
changes nothing; the emulator answers as the plugin."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune.admin.auth import TOKEN_ENV
from tabletune.admin.local import LocalBackend
from tabletune.admin.protocol import (
    STEP_CELLS_PATH,
    TABLE_PATH,
    CellSteps,
    EngineIdentity,
    StepCellsRead,
    TablePut,
    TableView,
)
from tabletune.admin.state import AdminError, CellNotFull, TableState, check_cell_steps
from tabletune.plugin.controller import EngineTableController
from tabletune.plugin.engine_backend import EngineUtilityBackend
from tabletune.plugin.step_timer import StepTimer
from tabletune.step_cells import CellTotals, cell_of
from tests.support.admin_apps import (
    APPS,
    MAX_NUM_SEQS,
    START,
    TOKEN,
    K,
    count_steps,
    plugin_app,
)

AUTH = {"Authorization": f"Bearer {TOKEN}"}
ONE_K = {"table": [[1, MAX_NUM_SEQS, 2]]}
ENGINE = EngineIdentity("0.26.0")


def when(k: int, batch_size: int, at_least: object) -> dict[str, Any]:
    return {**ONE_K, "when_cell_steps": {"k": k, "batch_size": batch_size, "at_least": at_least}}


@pytest.mark.parametrize("target", sorted(APPS))
def test_a_met_condition_swaps_and_answers_the_view_with_the_reading_it_was_decided_on(
    target: str,
) -> None:
    app = APPS[target]({TOKEN_ENV: TOKEN})
    client = app.client()
    before = app.state()
    response = client.put(TABLE_PATH, json=when(2, 5, 0), headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["step_cells"] == client.get(STEP_CELLS_PATH, headers=AUTH).json()
    assert StepCellsRead.from_wire(body["step_cells"]).cells == {}
    view = TableView.model_validate(body)  # what today's clients read of it
    assert view.table == ONE_K["table"] and view.version == before.version + 1
    assert response.headers["etag"] == f'"{view.version}"'
    assert app.state().ranges == ((1, MAX_NUM_SEQS, 2),)


@pytest.mark.parametrize("target", sorted(APPS))
def test_an_unmet_condition_is_a_412_with_the_reading_and_changes_nothing(target: str) -> None:
    app = APPS[target]({TOKEN_ENV: TOKEN})
    client = app.client()
    before, lookup = app.state(), app.installed()
    response = client.put(TABLE_PATH, json=when(2, 20, 1), headers=AUTH)
    assert response.status_code == 412
    body = response.json()
    assert set(body) == {"detail", "step_cells"}
    assert body["detail"] == (
        "when_cell_steps: cell k=2 batch 17-24 has 0 steps, fewer than 1: table unchanged"
    )
    assert StepCellsRead.from_wire(body["step_cells"]).started_at > 0
    assert app.state() == before and app.installed() is lookup


@pytest.mark.parametrize("target", sorted(APPS))
@pytest.mark.parametrize(
    ("condition", "problem"),
    [
        ({"k": K + 1, "batch_size": 5, "at_least": 0}, "no step runs in cell k=4 batch 5"),
        ({"k": 1, "batch_size": MAX_NUM_SEQS + 1, "at_least": 0}, "batch 257-264"),
        ({"k": 1, "batch_size": 5, "at_least": -1}, "at_least: Input should be greater"),
        ({"k": -1, "batch_size": 5, "at_least": 0}, "when_cell_steps.k"),
        ({"k": 1, "batch_size": 0, "at_least": 0}, "when_cell_steps.batch_size"),
        ({"k": 1, "batch_size": 5, "at_least": "8"}, "valid integer"),
        ({"k": 1, "batch_size": 5, "at_least": 8.0}, "valid integer"),
        ({"k": True, "batch_size": 5, "at_least": 8}, "valid integer"),
        ({"k": 1, "batch_size": 5, "at_least": 2**64}, "less than or equal"),
        ({"k": 1, "batch_size": 2**63, "at_least": 1}, "less than or equal"),
        ({"k": 1, "batch_size": 5}, "at_least: Field required"),
        ({"k": 1, "batch_size": 5, "at_least": 1, "cell": 3}, "Extra inputs"),
        ([1, 5, 8], "valid dictionary"),
    ],
)
def test_bad_conditions_are_a_clear_422_that_changes_nothing(
    target: str, condition: object, problem: str
) -> None:
    app = APPS[target]({TOKEN_ENV: TOKEN})
    before, lookup = app.state(), app.installed()
    body = {**ONE_K, "when_cell_steps": condition}
    response = app.client().put(TABLE_PATH, json=body, headers=AUTH)
    assert response.status_code == 422, response.text
    assert problem in response.json()["detail"]
    assert app.state() == before and app.installed() is lookup


@pytest.mark.parametrize("target", sorted(APPS))
def test_the_usual_rules_come_before_the_condition(target: str) -> None:
    app = APPS[target]({TOKEN_ENV: TOKEN})
    client = app.client()
    unmet = when(2, 5, 1)
    assert client.put(TABLE_PATH, json=unmet).status_code == 401  # a write: the token
    stale = client.put(TABLE_PATH, json=unmet, headers={**AUTH, "If-Match": '"7"'})
    assert stale.status_code == 409 and "step_cells" not in stale.json()
    bad_table = client.put(TABLE_PATH, json={**unmet, "table": [[2, 9, 1]]}, headers=AUTH)
    assert bad_table.status_code == 422
    met = when(2, 5, 0)
    current = {**AUTH, "If-Match": f'"{app.state().version}"'}
    assert client.put(TABLE_PATH, json=met, headers=current).status_code == 200


def test_the_plugin_decides_on_the_steps_its_engine_counted() -> None:
    app = plugin_app({TOKEN_ENV: TOKEN})
    assert app.timer is not None
    count_steps(app.timer, batch=5, k=3, steps=8)
    client = app.client()
    before = app.state()
    short = client.put(TABLE_PATH, json=when(3, 5, 9), headers=AUTH)
    assert short.status_code == 412 and "has 8 steps, fewer than 9" in short.json()["detail"]
    assert app.state() == before
    cells = StepCellsRead.from_wire(short.json()["step_cells"]).cells
    assert cells[(3, 5, 5)].steps == 8
    full = client.put(TABLE_PATH, json=when(3, 5, 8), headers=AUTH)
    assert full.status_code == 200
    assert full.json()["step_cells"] == short.json()["step_cells"]  # no step in between
    assert app.state().ranges == ((1, MAX_NUM_SEQS, 2),)
    assert app.installed()[1:] == [2] * MAX_NUM_SEQS


@settings(max_examples=50, deadline=None)
@given(
    counted=st.integers(0, 12),
    at_least=st.integers(0, 14),
    batch=st.integers(1, 40),
    asked=st.integers(1, 40),
)
def test_the_table_is_swapped_exactly_when_the_cell_holds_the_steps(
    counted: int, at_least: int, batch: int, asked: int
) -> None:
    """Any batch size of the same cell asks about the same counts (cells 17-24, 25-32, ...)."""
    timer = StepTimer(started_at=1.0)
    count_steps(timer, batch=batch, k=1, steps=counted)
    installed: list[object] = []
    state = TableState.initial(START, num_speculative_tokens=K, max_num_seqs=MAX_NUM_SEQS)
    controller = EngineTableController(
        state, installed.append, identity=ENGINE, read_cells=timer.read
    )
    answer = controller.put_table(when(1, asked, at_least), None)
    held = timer.read().cells.get((1, *cell_of(asked)), CellTotals()).steps
    assert answer["status"] == (200 if held >= at_least else 412)
    assert answer["step_cells"] == timer.to_wire()
    assert (controller.state.version == 1) == (answer["status"] == 200) == bool(installed)
    if cell_of(asked) == cell_of(batch):
        assert held == counted


def test_a_server_that_counts_no_step_cells_refuses_a_condition_with_404() -> None:
    state = TableState.initial(START, num_speculative_tokens=K, max_num_seqs=MAX_NUM_SEQS)
    body = TablePut.model_validate(when(1, 5, 0))
    with pytest.raises(AdminError) as refused:
        asyncio.run(LocalBackend(state, identity=ENGINE).put_table(body, None))
    assert refused.value.status == 404
    controller = EngineTableController(state, lambda lookup: None, identity=ENGINE)
    assert controller.put_table(when(1, 5, 0), None)["status"] == 404
    assert controller.state == state


def test_the_http_side_hands_on_the_reading_of_either_answer() -> None:
    timer = StepTimer(started_at=1.0)
    count_steps(timer, batch=4, k=1, steps=3)
    state = TableState.initial(START, num_speculative_tokens=K, max_num_seqs=MAX_NUM_SEQS)
    controller = EngineTableController(
        state, lambda lookup: None, identity=ENGINE, read_cells=timer.read
    )
    sent: list[object] = []
    reads: list[StepCellsRead] = []

    async def call(name: str, *args: Any) -> Any:
        sent.append(args[0])
        return controller.put_table(*args)

    backend = EngineUtilityBackend(call, on_steps=reads.append)
    with pytest.raises(CellNotFull) as refused:
        asyncio.run(backend.put_table(TablePut.model_validate(when(1, 4, 4)), None))
    assert refused.value.step_cells == timer.read()
    answer = asyncio.run(backend.put_table(TablePut.model_validate(when(1, 4, 3)), None))
    assert answer.step_cells == timer.read() and answer.view.version == 1
    assert reads == [timer.read(), timer.read()]
    # an unconditional PUT reaches the engine without the field (an older engine side takes it)
    asyncio.run(backend.put_table(TablePut.model_validate(ONE_K), None))
    assert sent[-1] == {"table": ONE_K["table"], "allow_uncaptured": False}


def test_a_condition_is_a_pure_check_of_one_reading() -> None:
    read = StepCellsRead({(2, 17, 24): CellTotals(steps=8, seconds=0.08)}, 0.0, 1.0)
    check_cell_steps(CellSteps(k=2, batch_size=24, at_least=8), read)
    with pytest.raises(CellNotFull) as refused:
        check_cell_steps(CellSteps(k=2, batch_size=17, at_least=9), read)
    assert refused.value.status == 412 and refused.value.step_cells is read
    with pytest.raises(CellNotFull):
        check_cell_steps(CellSteps(k=1, batch_size=20, at_least=1), read)
