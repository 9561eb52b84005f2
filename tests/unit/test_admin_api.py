"""The shared admin API (plugin and emulator): every refusal leaves the table as it was."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tabletune.admin.auth import AdminAuth
from tabletune.admin.local import LocalBackend
from tabletune.admin.protocol import (
    MAX_BODY_BYTES,
    SETTINGS_PATH,
    STEP_CELLS_PATH,
    TABLE_PATH,
    EngineIdentity,
    SettingsPut,
    StepCellsRead,
    TablePut,
)
from tabletune.admin.router import install_admin_api
from tabletune.admin.state import AdminError, TableState, parse_if_match
from tabletune.step_cells import CellTotals, cell_key

START = [[1, 1, 3], [2, 2, 2], [3, 3, 1], [4, 256, 0]]
TOKEN = "0123456789abcdef-test"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ENGINE = EngineIdentity("0.26.0", "m")


def make_client(
    ranges: list[list[int]] | None = START,
    auth: AdminAuth | None = None,
    identity: EngineIdentity = ENGINE,
) -> tuple[TestClient, LocalBackend]:
    """An app whose admin API wants ``TOKEN`` (sent by the client) unless ``auth`` says else."""
    state = TableState.initial(ranges, num_speculative_tokens=3, max_num_seqs=256)
    backend = LocalBackend(state, identity=identity)
    app = FastAPI()
    rules = AdminAuth(tokens=(TOKEN,)) if auth is None else auth
    install_admin_api(app, lambda request: backend, lambda request: rules)
    return TestClient(app, headers=AUTH if auth is None else None), backend


def test_initial_state_allows_exactly_the_starting_lengths() -> None:
    state = TableState.initial([[1, 64, 3], [65, 128, 1]], num_speculative_tokens=3, max_num_seqs=8)
    assert state.allowed_k == {1, 3}
    assert [state.k_for(b) for b in (1, 8, 999)] == [3, 3, 3]


def test_get_reports_everything_an_operator_needs() -> None:
    client, _ = make_client()
    response = client.get(TABLE_PATH)
    assert response.status_code == 200
    body = response.json()
    assert body["table"] == START and body["dynamic"] is True and body["version"] == 0
    assert body["allowed_k"] == [0, 1, 2, 3] and body["num_speculative_tokens"] == 3
    assert body["engine_version"] == "0.26.0" and body["plugin_version"]
    assert response.headers["etag"] == '"0"'


@given(
    version=st.text(max_size=12),
    model=st.none() | st.text(max_size=12),
    tensor_parallel=st.none() | st.integers(1, 64),
)
@settings(max_examples=25, deadline=None)
def test_the_engines_identity_goes_out_as_three_flat_fields(
    version: str, model: str | None, tensor_parallel: int | None
) -> None:
    client, _ = make_client(identity=EngineIdentity(version, model, tensor_parallel))
    body = client.get(TABLE_PATH).json()
    assert "identity" not in body
    assert (body["engine_version"], body["model_name"], body["tensor_parallel_size"]) == (
        version,
        model,
        tensor_parallel,
    )


def test_put_swaps_whole_and_bumps_version() -> None:
    client, backend = make_client()
    response = client.put(TABLE_PATH, json={"table": [[1, 32, 3], [33, 256, 1]]})
    assert response.status_code == 200, response.text
    assert response.json()["version"] == 1
    assert backend.state.k_for(32) == 3 and backend.state.k_for(33) == 1
    response = client.put(TABLE_PATH, json={"table": [[1, 256, 2]]}, headers={"If-Match": '"1"'})
    assert response.json()["version"] == 2 and backend.state.k_for(200) == 2


@pytest.mark.parametrize(
    ("body", "headers", "status", "reason"),
    [
        ({"table": [[1, 8, 3], [8, 16, 1]]}, {}, 422, "overlap"),
        ({"table": [[2, 256, 1]]}, {}, 422, "start at 1"),
        ({"table": [[1, 256, 4]]}, {}, 422, "exceeds"),
        ({"table": [[1, 256, -1]]}, {}, 422, ">= 0"),
        ({"table": [[1, "8", 1]]}, {}, 422, "table"),
        ({"table": "[[1,8,1]]"}, {}, 422, "table"),
        ({"tabel": [[1, 8, 1]]}, {}, 422, "tabel"),
        ({"table": [[1, 256, 1]]}, {"If-Match": '"5"'}, 409, "version mismatch"),
        ({"table": [[1, 256, 1]]}, {"If-Match": "abc"}, 400, "If-Match"),
    ],
)
def test_bad_puts_are_refused_and_change_nothing(
    body: object, headers: dict[str, str], status: int, reason: str
) -> None:
    client, backend = make_client()
    before = backend.state
    response = client.put(TABLE_PATH, json=body, headers=headers)
    assert response.status_code == status, response.text
    assert reason in response.json()["detail"]
    assert backend.state == before


def test_uncaptured_k_needs_an_explicit_override() -> None:
    client, backend = make_client([[1, 64, 3], [65, 256, 1]])
    response = client.put(TABLE_PATH, json={"table": [[1, 256, 2]]})
    assert response.status_code == 422 and "not in the starting table" in response.json()["detail"]
    assert backend.state.version == 0
    forced = client.put(TABLE_PATH, json={"table": [[1, 256, 2]], "allow_uncaptured": True})
    assert forced.status_code == 200 and backend.state.k_for(1) == 2


def test_invalid_json_and_huge_bodies() -> None:
    client, backend = make_client()
    response = client.put(
        TABLE_PATH, content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    huge = b'{"table": [' + b"[1,1,1]," * (MAX_BODY_BYTES // 8) + b"[2,2,1]]}"
    assert client.put(TABLE_PATH, content=huge).status_code == 413
    assert backend.state.version == 0


def test_static_engine_says_so_and_refuses_tables() -> None:
    client, backend = make_client(None)
    body = client.get(TABLE_PATH).json()
    assert body["dynamic"] is False and body["table"] is None and body["reason"]
    response = client.put(TABLE_PATH, json={"table": [[1, 256, 1]]})
    assert response.status_code == 409 and "restart" in response.json()["detail"]
    assert backend.state.ranges is None


def test_token_auth() -> None:
    client, backend = make_client(auth=AdminAuth(tokens=(TOKEN,)))
    assert client.get(TABLE_PATH).status_code == 401
    assert client.get(TABLE_PATH, headers={"Authorization": "Bearer wrong"}).status_code == 401
    refused = client.put(TABLE_PATH, json={"table": [[1, 256, 1]]})
    assert refused.status_code == 401 and backend.state.version == 0
    assert refused.headers["www-authenticate"] == "Bearer"
    ok = client.get(TABLE_PATH, headers=AUTH)
    assert ok.status_code == 200


def test_no_engine_is_503() -> None:
    app = FastAPI()
    install_admin_api(app, lambda request: None, lambda request: AdminAuth(tokens=(TOKEN,)))
    assert TestClient(app).get(TABLE_PATH, headers=AUTH).status_code == 503
    assert TestClient(app).get(STEP_CELLS_PATH, headers=AUTH).status_code == 503


CELLS = StepCellsRead(
    {(2, 17, 24): CellTotals(3.0, 0.03, 0.0003, 180.0, 60.0), (0, 1, 1): CellTotals(1, 0.01)},
    steps_without_decode=2.0,
    started_at=1_700_000_000.5,
    switch_steps=1.0,
    switch_seconds=0.02,
)


def test_step_cells_are_the_engines_totals_on_the_wire() -> None:
    state = TableState.initial(START, num_speculative_tokens=3, max_num_seqs=256)
    backend = LocalBackend(state, identity=EngineIdentity("0.26.0"), step_cells=lambda: CELLS)
    app = FastAPI()
    install_admin_api(app, lambda request: backend, lambda request: AdminAuth(tokens=(TOKEN,)))
    client = TestClient(app)
    assert client.get(STEP_CELLS_PATH).status_code == 401  # the table GET's rules
    response = client.get(STEP_CELLS_PATH, headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["cells"] == [[0, 1, 1, 1, 0.01, 0, 0, 0], [2, 17, 24, 3, 0.03, 0.0003, 180, 60]]
    assert body["steps_without_decode"] == 2 and body["switch_steps"] == 1
    assert StepCellsRead.from_wire(body) == CELLS
    assert backend.state.version == 0  # a read changes nothing


def test_a_server_that_counts_no_step_cells_says_so_with_a_404() -> None:
    client, _ = make_client()
    response = client.get(STEP_CELLS_PATH)
    assert response.status_code == 404 and "step cells" in response.json()["detail"]


@given(
    cells=st.dictionaries(
        st.tuples(st.integers(0, 7), st.integers(1, 300)).map(lambda kb: cell_key(*kb)),
        st.tuples(*[st.floats(0, 1e12)] * 5).map(lambda v: CellTotals(*v)),
        max_size=8,
    ),
    numbers=st.tuples(*[st.floats(0, 1e12)] * 4),
)
def test_step_cells_survive_the_wire(
    cells: dict[tuple[int, int, int], CellTotals], numbers: tuple[float, ...]
) -> None:
    read = StepCellsRead(cells, *numbers)
    assert StepCellsRead.from_wire(json.loads(json.dumps(read.to_wire()))) == read


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"cells": [], "started_at": -1},
        {"cells": [], "started_at": True},
        {"cells": [[1, 2, 2, 1, 0.1]], "started_at": 1.0},
        {"cells": [], "started_at": 1.0, "switch_steps": "x"},
    ],
)
def test_malformed_step_cells_are_a_value_error(bad: object) -> None:
    with pytest.raises(ValueError):
        StepCellsRead.from_wire(bad)


def test_settings_round_trip_and_validation() -> None:
    client, backend = make_client()
    response = client.put(SETTINGS_PATH, json={"exploration_interval": 50, "hysteresis": 4})
    assert response.status_code == 200
    assert backend.state.exploration_interval == 50 and backend.state.hysteresis == 4
    assert client.put(SETTINGS_PATH, json={"hysteresis": -1}).status_code == 422
    assert client.put(SETTINGS_PATH, json={"exploration_interval": "50"}).status_code == 422
    assert backend.state.hysteresis == 4
    assert client.get(SETTINGS_PATH).json()["exploration_interval"] == 50


def test_if_match_forms() -> None:
    assert parse_if_match(None) is None and parse_if_match("*") is None
    assert parse_if_match('"7"') == 7 and parse_if_match("7") == 7 and parse_if_match('W/"7"') == 7
    with pytest.raises(AdminError):
        parse_if_match("seven")


def test_state_transition_is_pure() -> None:
    state = TableState.initial(START, num_speculative_tokens=3, max_num_seqs=16)
    new = state.with_table(TablePut(table=[[1, 16, 1]]), if_match=0)
    assert state.version == 0 and state.k_for(1) == 3
    assert new.version == 1 and new.k_for(1) == 1


def test_neighbour_interval_and_step_timing_round_trip() -> None:
    client, backend = make_client()
    assert backend.state.neighbour_interval == 0 and backend.state.step_timing is True
    response = client.put(SETTINGS_PATH, json={"neighbour_interval": 16, "step_timing": False})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["neighbour_interval"] == 16 and body["step_timing"] is False
    assert body["neighbour_steps"] == 0 and body["version"] == 1
    client.put(SETTINGS_PATH, json={"hysteresis": 2})  # omitted fields stay as they are
    assert backend.state.neighbour_interval == 16 and backend.state.step_timing is False


def test_chosen_neighbour_ks_are_captured_ones_and_an_empty_list_restores_adjacent() -> None:
    client, backend = make_client()
    response = client.put(SETTINGS_PATH, json={"neighbour_ks": [3, 0, 3]})
    assert response.status_code == 200, response.text
    assert response.json()["neighbour_ks"] == [0, 3] and backend.state.neighbour_ks == (0, 3)
    client.put(SETTINGS_PATH, json={"neighbour_ks": []})
    assert backend.state.neighbour_ks == ()


@pytest.mark.parametrize(
    "body",
    [
        {"neighbour_interval": -1},
        {"neighbour_interval": 1_000_001},
        {"neighbour_interval": "16"},
        {"neighbour_interval": 1.5},
        {"neighbour_interval": True},
        {"step_timing": "false"},
        {"step_timing": 0},
        {"step_timing": 1},
        {"step_timing": [True]},
        {"neighbour_interval": 4, "step_timing": "no"},  # one bad field refuses the whole body
        {"neighbour_ks": [4]},  # not in the starting table: no captured graph
        {"neighbour_ks": [-1]},
        {"neighbour_ks": ["1"]},
        {"neighbour_ks": 1},
        {"neighbour_ks": [1] * 65},
        {"neighbour_burst": 0},
    ],
)
def test_bad_new_settings_are_refused_and_change_nothing(body: dict[str, object]) -> None:
    client, backend = make_client()
    before = backend.state
    response = client.put(SETTINGS_PATH, json=body)
    assert response.status_code == 422 and response.json()["detail"]
    assert backend.state == before


json_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=2_000_000),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=60)
@given(interval=json_values, timing=json_values)
def test_any_settings_body_is_applied_whole_or_refused_whole(
    interval: object, timing: object
) -> None:
    state = TableState.initial(START, num_speculative_tokens=3, max_num_seqs=16)
    valid_interval = interval is None or (type(interval) is int and 0 <= interval <= 1_000_000)
    valid_timing = timing is None or isinstance(timing, bool)
    try:
        body = SettingsPut.model_validate({"neighbour_interval": interval, "step_timing": timing})
    except ValidationError:
        assert not (valid_interval and valid_timing)
        return
    assert valid_interval and valid_timing
    new = state.with_settings(body, if_match=None)
    assert new.neighbour_interval == (0 if interval is None else interval)
    assert new.step_timing == (True if timing is None else timing)
    assert state.neighbour_interval == 0 and state.step_timing is True  # the old state stays


def test_the_nightjar_policy_is_off_by_default_and_round_trips() -> None:
    client, backend = make_client()
    view = client.get(SETTINGS_PATH).json()
    assert view["policy"] == "table" and view["nightjar_exploration"] == 1.0
    assert view["nightjar_steps"] == 0
    response = client.put(SETTINGS_PATH, json={"policy": "nightjar", "nightjar_exploration": 0.5})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["policy"] == "nightjar" and body["nightjar_exploration"] == 0.5
    assert backend.state.policy == "nightjar" and backend.state.version == 1
    # The daemon's table still goes in while the bandit runs: it is what "table" falls back to.
    assert client.put(TABLE_PATH, json={"table": [[1, 256, 1]]}).status_code == 200
    assert backend.state.policy == "nightjar" and backend.state.k_for(7) == 1
    client.put(SETTINGS_PATH, json={"nightjar_exploration": 2})  # an integer is a number too
    assert backend.state.nightjar_exploration == 2.0 and backend.state.policy == "nightjar"
    assert client.put(SETTINGS_PATH, json={"policy": "table"}).status_code == 200
    assert backend.state.policy == "table" and backend.state.nightjar_exploration == 2.0


@pytest.mark.parametrize(
    "body",
    [
        {"policy": "bandit"},
        {"policy": "Nightjar"},
        {"policy": None, "nightjar_exploration": -0.1},
        {"policy": 1},
        {"policy": True},
        {"policy": ["nightjar"]},
        {"nightjar_exploration": "1"},
        {"nightjar_exploration": True},
        {"nightjar_exploration": 101},
        {"policy": "nightjar", "nightjar_exploration": -1},  # one bad field refuses both
        {"policy": "nightjar", "step_timing": False},  # it learns from the step timer
    ],
)
def test_bad_policy_settings_are_refused_and_change_nothing(body: dict[str, object]) -> None:
    client, backend = make_client()
    before = backend.state
    response = client.put(SETTINGS_PATH, json=body)
    assert response.status_code == 422 and response.json()["detail"]
    assert "\n" not in response.json()["detail"]
    assert backend.state == before


@pytest.mark.parametrize("number", [b"Infinity", b"NaN", b"-Infinity"])
def test_a_non_finite_exploration_is_refused(number: bytes) -> None:
    client, backend = make_client()
    body = b'{"policy": "nightjar", "nightjar_exploration": ' + number + b"}"
    response = client.put(SETTINGS_PATH, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422 and backend.state.version == 0


def test_the_nightjar_policy_needs_step_timing_and_keeps_it_on() -> None:
    client, backend = make_client()
    client.put(SETTINGS_PATH, json={"step_timing": False})
    answer = client.put(SETTINGS_PATH, json={"policy": "nightjar"})
    assert answer.status_code == 422 and "step_timing" in answer.json()["detail"]
    client.put(SETTINGS_PATH, json={"step_timing": True, "policy": "nightjar"})
    before = backend.state
    assert client.put(SETTINGS_PATH, json={"step_timing": False}).status_code == 422
    assert backend.state == before


def test_a_static_engine_has_no_k_to_choose_for_the_bandit() -> None:
    client, backend = make_client(ranges=None)
    answer = client.put(SETTINGS_PATH, json={"policy": "nightjar"})
    assert answer.status_code == 409 and "static" in answer.json()["detail"]
    assert backend.state.policy == "table" and backend.state.version == 0
    assert client.put(SETTINGS_PATH, json={"policy": "table"}).status_code == 200
