"""The in-process admin sides answer like the plugin's HTTP side: the same bodies, the same
refusals (a bad body is a 422, a stale If-Match a 409), and the state changes only on success."""

from __future__ import annotations

import pytest

from tabletune.admin.client import AdminRefused, StateAdminClient
from tabletune.admin.protocol import EngineIdentity
from tabletune.admin.state import TableState

START = [[1, 8, 3], [9, 64, 1]]


def _client() -> StateAdminClient:
    return StateAdminClient(
        TableState.initial(START, num_speculative_tokens=3, max_num_seqs=64),
        identity=EngineIdentity("0.26.0", "m"),
    )


def test_overlapping_ranges_are_a_422_and_change_nothing() -> None:
    client = _client()
    before = client.get_table()
    with pytest.raises(AdminRefused) as refused:
        client.put_table([[1, 10, 3], [8, 64, 1]])
    assert refused.value.status == 422
    assert client.get_table() == before


def test_an_unknown_setting_value_is_a_422() -> None:
    client = _client()
    with pytest.raises(AdminRefused) as refused:
        client.put_settings(hysteresis=-1)
    assert refused.value.status == 422


def test_a_stale_version_is_a_409_and_the_current_one_applies() -> None:
    client = _client()
    version = client.get_table().version
    with pytest.raises(AdminRefused) as refused:
        client.put_table([[1, 64, 1]], if_match=version + 5)
    assert refused.value.status == 409
    view = client.put_table([[1, 64, 1]], if_match=version)
    assert view.version == version + 1
    assert client.put_settings(exploration_interval=10).exploration_interval == 10
