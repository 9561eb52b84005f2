"""bench/live_step_time_sim.py: a run with other daemon settings never writes over the default's."""

from __future__ import annotations

import pytest
from bench.live_step_time_sim import result_name, settings_of


def test_other_settings_name_their_own_result() -> None:
    assert result_name({}) == "live_step_time_sim"
    env = settings_of(["decision__trials=true"])
    assert env == {"DECISION__TRIALS": "true"}
    assert result_name(env) == "live_step_time_sim_trials_true"


@pytest.mark.parametrize("bad", ["DECISION__TRIALS", "TRIALS=true", "=true"])
def test_a_setting_without_group_name_and_value_is_refused(bad: str) -> None:
    with pytest.raises(SystemExit, match="GROUP__NAME=VALUE"):
        settings_of([bad])


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("DECISION__TRIALS=perhaps", "TABLETUNE_DECISION__TRIALS"),
        ("DECISION__NO_SUCH=1", "NO_SUCH"),
        ("LOOP__INTERVAL_S=3", "sets LOOP__INTERVAL_S itself"),
    ],
)
def test_a_setting_the_daemon_or_the_benchmark_would_refuse_is_refused_before_any_run(
    bad: str, says: str
) -> None:
    with pytest.raises(SystemExit, match=says):
        settings_of([bad])
