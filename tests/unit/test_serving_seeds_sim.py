"""bench/serving_seeds_sim.py: arms are checked before any run; a load's seeds sum up."""

from __future__ import annotations

import pytest
from bench.serving_seeds_sim import arm_settings, main, summed, sweep


def test_an_arm_is_the_defaults_or_its_checked_settings() -> None:
    assert arm_settings("") == {}
    assert arm_settings("DECISION__OVERSOLD_FOR_S=0,plugin__exploration_cost_budget=0") == {
        "DECISION__OVERSOLD_FOR_S": "0",
        "PLUGIN__EXPLORATION_COST_BUDGET": "0",
    }


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--arm", "DECISION__NO_SUCH=1"], "NO_SUCH"),
        (["--arm", "LOOP__INTERVAL_S=3"], "sets LOOP__INTERVAL_S itself"),
        (["--seeds", "0"], "at least 1"),
        (["--loads", "0,160"], "at least 1"),
    ],
)
def test_bad_arguments_are_refused_before_any_run(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert says in str(refused.value) + capsys.readouterr().err


def test_a_loads_seeds_are_summed() -> None:
    runs = [
        {"seed": 1, "final_k": 1, "table_loss": 0.0, "measured_loss": 0.001},
        {"seed": 2, "final_k": 2, "table_loss": 0.08, "measured_loss": 0.07},
    ]
    got = summed(runs)
    assert got["runs"] == 2 and got["table_right"] == 1
    assert got["table_loss_worst"] == 0.08 and abs(got["measured_loss_mean"] - 0.0355) < 1e-12


def test_one_seed_at_one_load_runs_the_daemon() -> None:
    result = sweep({}, [48], 1)["48"]
    assert result["runs"] == 1 and result["per_seed"][0]["seed"] == 1
    assert 0.0 <= result["table_loss_worst"] < 1.0
