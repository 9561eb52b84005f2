"""The engine side's logic with a fake scheduler: swaps, versions, refusals change nothing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tabletune.admin.protocol import EngineIdentity
from tabletune.admin.state import AdminError, TableState
from tabletune.plugin.bandit import NightjarLookup
from tabletune.plugin.controller import EngineTableController
from tabletune.plugin.engine import build_controller, step_timer_of
from tabletune.plugin.policy import StepPolicy
from tabletune.plugin.wire import view_from_envelope
from tabletune.schemas.table import dense_lookup

START = [[1, 1, 0], [2, 2, 1], [3, 3, 2], [4, 256, 3]]


def fake_core(table: list[list[int]] | None = START, tensor_parallel_size: int = 1) -> Any:
    spec = SimpleNamespace(num_speculative_tokens=3, num_speculative_tokens_per_batch_size=table)
    scheduler = SimpleNamespace(
        num_spec_tokens=3,
        scheduler_config=SimpleNamespace(max_num_seqs=256),
        dynamic_sd_lookup=None
        if table is None
        else dense_lookup(
            [tuple(r) for r in table],
            256,
            3,  # type: ignore[misc]
        ),
    )
    vllm_config = SimpleNamespace(
        speculative_config=spec,
        model_config=SimpleNamespace(served_model_name="qwen3-4b"),
        parallel_config=SimpleNamespace(tensor_parallel_size=tensor_parallel_size),
    )
    return SimpleNamespace(scheduler=scheduler, vllm_config=vllm_config)


def test_built_from_the_engines_config() -> None:
    controller = build_controller(fake_core(), engine_version="0.26.0")
    view = view_from_envelope(controller.get())
    assert view.table == START and view.allowed_k == [0, 1, 2, 3] and view.version == 0
    assert view.model_name == "qwen3-4b" and view.engine_version == "0.26.0"


def test_the_view_reports_the_engines_tensor_parallel_size() -> None:
    view = build_controller(fake_core(tensor_parallel_size=2), engine_version="0.26.0").view()
    assert view.tensor_parallel_size == 2
    core = fake_core()
    del core.vllm_config.parallel_config  # an engine config without it: not reported
    assert build_controller(core, engine_version="0.26.0").view().tensor_parallel_size is None


def test_put_installs_the_new_lookup_in_the_scheduler() -> None:
    core = fake_core()
    controller = build_controller(core, engine_version="0.26.0")
    view = view_from_envelope(controller.put_table({"table": [[1, 256, 2]]}, None))
    assert view.version == 1 and view.table == [[1, 256, 2]]
    lookup = core.scheduler.dynamic_sd_lookup
    assert isinstance(lookup, list) and lookup[1] == 2 and lookup[256] == 2


@pytest.mark.parametrize(
    ("body", "if_match", "status"),
    [
        ({"table": [[1, 8, 3], [8, 256, 1]]}, None, 422),
        ({"table": [[1, 256, 4]]}, None, 422),
        ({"table": [[1, 256, "2"]]}, None, 422),
        ({"table": [[1, 256, 1]], "extra": 1}, None, 422),
        ([[1, 256, 1]], None, 422),
        ({"table": [[1, 256, 1]]}, 5, 409),
    ],
)
def test_refusals_keep_state_and_lookup(body: object, if_match: int | None, status: int) -> None:
    core = fake_core()
    controller = build_controller(core, engine_version="0.26.0")
    before_lookup = core.scheduler.dynamic_sd_lookup
    envelope = controller.put_table(body, if_match)
    assert envelope["status"] == status
    with pytest.raises(AdminError):
        view_from_envelope(envelope)
    assert core.scheduler.dynamic_sd_lookup is before_lookup
    assert view_from_envelope(controller.get()).version == 0


def test_uncaptured_k_needs_the_override() -> None:
    core = fake_core([[1, 64, 3], [65, 256, 1]])
    controller = build_controller(core, engine_version="0.26.0")
    assert controller.put_table({"table": [[1, 256, 2]]}, None)["status"] == 422
    forced = controller.put_table({"table": [[1, 256, 2]], "allow_uncaptured": True}, None)
    assert forced["status"] == 200 and core.scheduler.dynamic_sd_lookup[10] == 2


def test_static_k_get_says_so_and_put_is_409() -> None:
    core = fake_core(None)
    controller = build_controller(core, engine_version="0.26.0")
    view = view_from_envelope(controller.get())
    assert view.dynamic is False and view.table is None and view.reason
    envelope = controller.put_table({"table": [[1, 256, 1]]}, None)
    assert envelope["status"] == 409 and "restart" in envelope["detail"]
    assert core.scheduler.dynamic_sd_lookup is None


def test_settings_install_a_policy_and_off_restores_a_plain_list() -> None:
    core = fake_core()
    controller = build_controller(core, engine_version="0.26.0")
    controller.put_table({"table": [[1, 256, 1]]}, None)
    view = view_from_envelope(controller.put_settings({"exploration_interval": 4}, 1))
    assert view.exploration_interval == 4 and view.version == 2
    policy = core.scheduler.dynamic_sd_lookup
    assert isinstance(policy, StepPolicy)
    assert [policy[10] for _ in range(8)] == [1, 1, 1, 3, 1, 1, 1, 3]
    assert view_from_envelope(controller.get()).exploration_steps == 2
    view = view_from_envelope(controller.put_settings({"exploration_interval": 0}, None))
    assert isinstance(core.scheduler.dynamic_sd_lookup, list)
    assert view.exploration_steps == 2  # counted steps survive the swap


def test_settings_refusal_keeps_the_policy() -> None:
    core = fake_core()
    controller = build_controller(core, engine_version="0.26.0")
    controller.put_settings({"hysteresis": 3}, None)
    policy = core.scheduler.dynamic_sd_lookup
    assert controller.put_settings({"hysteresis": -1}, None)["status"] == 422
    assert controller.put_settings({"hysteresis": 1}, 0)["status"] == 409
    assert core.scheduler.dynamic_sd_lookup is policy


def test_install_is_one_assignment_of_a_complete_lookup() -> None:
    installed: list[object] = []
    state = TableState.initial(START, num_speculative_tokens=3, max_num_seqs=8)
    controller = EngineTableController(state, installed.append, identity=EngineIdentity("x"))
    controller.put_table({"table": [[1, 4, 3], [5, 8, 0]]}, None)
    assert installed == [[0, 3, 3, 3, 3, 0, 0, 0, 0]]


def test_neighbour_exploration_installs_a_policy_and_counts_its_steps() -> None:
    core = fake_core()
    controller = build_controller(core, engine_version="0.26.0")
    controller.put_table({"table": [[1, 256, 2]]}, None)
    settings = {"neighbour_interval": 4, "neighbour_burst": 2}
    view = view_from_envelope(controller.put_settings(settings, None))
    assert (view.neighbour_interval, view.neighbour_burst) == (4, 2)
    policy = core.scheduler.dynamic_sd_lookup
    assert isinstance(policy, StepPolicy)
    ks = [policy[50] for _ in range(10)]  # allowed 0..3: bursts of 2 at k=1, then at k=3
    assert ks == [2, 2, 2, 1, 1, 2, 2, 3, 3, 2]
    assert view_from_envelope(controller.get()).neighbour_steps == 4
    controller.put_settings({"neighbour_interval": 0}, None)
    assert isinstance(core.scheduler.dynamic_sd_lookup, list)
    assert view_from_envelope(controller.get()).neighbour_steps == 4  # survives the swap


def test_step_timing_off_stops_all_per_step_work_and_on_restores_it() -> None:
    core = fake_core()
    controller = build_controller(core, engine_version="0.26.0")
    timer = step_timer_of(core.scheduler)
    settings = {"exploration_interval": 50, "hysteresis": 4, "neighbour_interval": 16}
    controller.put_settings(settings, None)
    assert isinstance(core.scheduler.dynamic_sd_lookup, StepPolicy) and timer.enabled
    view = view_from_envelope(controller.put_settings({"step_timing": False}, None))
    assert view.step_timing is False and view.neighbour_interval == 16  # settings are kept
    assert isinstance(core.scheduler.dynamic_sd_lookup, list) and not timer.enabled
    assert core.scheduler.dynamic_sd_lookup == dense_lookup([tuple(r) for r in START], 256, 3)  # type: ignore[misc]
    controller.put_settings({"step_timing": True}, None)
    assert isinstance(core.scheduler.dynamic_sd_lookup, StepPolicy) and timer.enabled


def test_step_timing_switches_the_timer_of_a_static_engine_too() -> None:
    core = fake_core(None)
    controller = build_controller(core, engine_version="0.26.0")
    controller.put_settings({"step_timing": False}, None)
    assert not step_timer_of(core.scheduler).enabled and core.scheduler.dynamic_sd_lookup is None


def test_refused_new_settings_keep_policy_timer_and_version() -> None:
    core = fake_core()
    controller = build_controller(core, engine_version="0.26.0")
    controller.put_settings({"neighbour_interval": 8}, None)
    policy = core.scheduler.dynamic_sd_lookup
    for body in ({"neighbour_interval": -3}, {"step_timing": "off"}, {"neighbour_interval": 2.0}):
        assert controller.put_settings(body, None)["status"] == 422
    assert core.scheduler.dynamic_sd_lookup is policy and step_timer_of(core.scheduler).enabled
    assert view_from_envelope(controller.get()).version == 1


def test_a_new_table_takes_effect_at_once_even_inside_the_hysteresis_band() -> None:
    # The load sits at B=128; the old table ran k=3 there. The new one gives 121..128 k=2 and
    # 129.. k=3: B=128 is within h=2 of a k=3 batch size, but the k=3 it held came from the
    # old table, so it must not be kept (it would be, for as long as the load stays put).
    core = fake_core()
    controller = build_controller(core, engine_version="0.26.0")
    controller.put_settings({"hysteresis": 2}, None)
    controller.put_table({"table": [[1, 256, 3]]}, None)
    policy = core.scheduler.dynamic_sd_lookup
    assert [policy[128] for _ in range(3)] == [3, 3, 3]
    controller.put_table({"table": [[1, 120, 3], [121, 128, 2], [129, 256, 3]]}, None)
    policy = core.scheduler.dynamic_sd_lookup
    assert [policy[128] for _ in range(3)] == [2, 2, 2]
    assert [policy[129], policy[130], policy[131]] == [2, 2, 3]  # held near the edge, then k=3
    controller.put_settings({"exploration_interval": 50}, None)  # same table: the held k stays
    assert core.scheduler.dynamic_sd_lookup[128] == 3


def test_the_nightjar_policy_installs_a_bandit_over_the_captured_k() -> None:
    core = fake_core()
    controller = build_controller(core, engine_version="0.26.0")
    controller.put_settings({"hysteresis": 2, "exploration_interval": 4}, None)
    view = view_from_envelope(controller.put_settings({"policy": "nightjar"}, None))
    assert view.policy == "nightjar" and view.nightjar_exploration == 1.0
    bandit = core.scheduler.dynamic_sd_lookup
    assert isinstance(bandit, NightjarLookup) and bandit.allowed_k == (0, 1, 2, 3)
    # UCB1 plays each arm once: unrewarded, an arm is played again (no step taught it).
    assert [bandit[40] for _ in range(3)] == [0, 0, 0]
    for k in (0, 1, 2, 3):
        bandit.learn(40, k, 40 * (1 + k), 0.02)
        assert bandit[40] == min(k + 1, 3) or k == 3
    assert view_from_envelope(controller.get()).nightjar_steps == 7
    assert view_from_envelope(controller.get()).exploration_steps == 0  # the table's is off


def test_the_bandit_keeps_learning_through_tables_and_other_settings() -> None:
    core = fake_core()
    controller = build_controller(core, engine_version="0.26.0")
    controller.put_settings({"policy": "nightjar"}, None)
    bandit = core.scheduler.dynamic_sd_lookup
    view = view_from_envelope(controller.put_table({"table": [[1, 256, 1]]}, None))
    assert view.table == [[1, 256, 1]] and view.policy == "nightjar"
    controller.put_settings({"hysteresis": 3, "neighbour_interval": 8}, None)
    assert core.scheduler.dynamic_sd_lookup is bandit  # what it learnt stays
    controller.put_settings({"nightjar_exploration": 0.25}, None)
    fresh = core.scheduler.dynamic_sd_lookup
    assert isinstance(fresh, NightjarLookup) and fresh is not bandit
    assert fresh.exploration == 0.25


def test_policy_table_restores_the_table_and_counts_survive() -> None:
    core = fake_core()
    controller = build_controller(core, engine_version="0.26.0")
    controller.put_table({"table": [[1, 256, 2]]}, None)
    controller.put_settings({"policy": "nightjar"}, None)
    bandit = core.scheduler.dynamic_sd_lookup
    for _ in range(5):
        bandit[10]
    controller.put_settings({"policy": "table"}, None)
    assert core.scheduler.dynamic_sd_lookup == dense_lookup([(1, 256, 2)], 256, 3)
    controller.put_settings({"policy": "nightjar"}, None)
    again = core.scheduler.dynamic_sd_lookup
    assert isinstance(again, NightjarLookup) and again is not bandit and again.steps == 0
    again[10]
    assert view_from_envelope(controller.get()).nightjar_steps == 6
    controller.put_settings({"exploration_interval": 4, "policy": "table"}, None)
    assert isinstance(core.scheduler.dynamic_sd_lookup, StepPolicy)


def test_a_refused_policy_change_keeps_the_bandit() -> None:
    core = fake_core()
    controller = build_controller(core, engine_version="0.26.0")
    controller.put_settings({"policy": "nightjar"}, None)
    bandit = core.scheduler.dynamic_sd_lookup
    for body in ({"policy": "ucb"}, {"step_timing": False}, {"nightjar_exploration": -1}):
        assert controller.put_settings(body, None)["status"] == 422
    assert core.scheduler.dynamic_sd_lookup is bandit and step_timer_of(core.scheduler).enabled
