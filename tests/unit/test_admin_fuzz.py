"""Fuzzed admin requests against the plugin and the emulator (``tests.support.admin_fuzz``):
no 5xx, no invalid table accepted, no partial apply, no write against the rules.

The suite sends 200 drawn requests per target and access mode, derandomized, after the known
attacks and one request per outcome. The 10,000 of
bench/results/admin_fuzz.json: ``bench/admin_fuzz.py``, or this module with
``TABLETUNE_FUZZ_PROFILE=admin-fuzz-10k`` (``admin-fuzz-10k-random`` for new random draws).
"""

from __future__ import annotations

import asyncio
import os

import pytest
from hypothesis import given, settings

from tabletune.admin.protocol import SETTINGS_PATH, TABLE_PATH
from tests.support.admin_apps import plugin_app
from tests.support.admin_fuzz import (
    MODES,
    FuzzRequest,
    Tally,
    requests,
    resolve_if_match,
    run_fuzz,
    send,
)

PROFILE = os.environ.get("TABLETUNE_FUZZ_PROFILE", "admin-fuzz")


@pytest.mark.parametrize("mode", sorted(MODES))
def test_fuzzed_requests_keep_every_invariant_and_the_emulator_answers_as_the_plugin(
    mode: str,
) -> None:
    plugin, sim = Tally(), Tally()
    run_fuzz("plugin", mode, profile=PROFILE, tally=plugin)
    run_fuzz("sim", mode, profile=PROFILE, tally=sim)
    assert plugin.violations == [] and sim.violations == []
    assert plugin.requests >= settings.get_profile(PROFILE).max_examples
    # The same requests in the same order (derandomized): the same status and body each time.
    assert plugin.answers == sim.answers
    if mode == "token":  # the invariants were exercised, not only refusals
        assert plugin.accepted_tables > 0 and plugin.accepted_settings > 0
        assert {400, 401, 403, 409, 412, 413, 422} <= set(plugin.statuses)


def test_without_an_engine_the_only_5xx_is_the_deliberate_503() -> None:
    app = plugin_app(MODES["token"], engine=False)
    loop = asyncio.new_event_loop()
    statuses: set[int] = set()

    @settings(settings.get_profile("admin-fuzz"))
    @given(request=requests())
    def one(request: FuzzRequest) -> None:
        answer = loop.run_until_complete(send(app, request, resolve_if_match(request, app.state())))
        statuses.add(answer.status)
        assert answer.status < 500 or answer.status == 503, answer.body
        assert not (answer.status == 200 and request.path in (TABLE_PATH, SETTINGS_PATH))

    try:
        one()
    finally:
        loop.close()
    assert 503 in statuses
