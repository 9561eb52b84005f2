"""``register()`` against stand-in vLLM modules: version gate, compat wrap, EngineCore methods,
the step timing around ``Scheduler.update_from_output``."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace
from typing import Any

import pytest

from tabletune.plugin import engine, wire
from tabletune.plugin.bandit import NightjarLookup
from tabletune.plugin.compat import PATCHED_MARK

from .test_plugin_controller import START, fake_core


class FakeScheduler:
    """vLLM's Scheduler as the wrapper uses it: update_from_output, then has_requests, and the
    lookup the plugin installs (None without a table, as vLLM's)."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.dynamic_sd_lookup: object = None
        self.remaining = 1
        self.calls = 0

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        self.calls += 1
        self.clock[0] += 0.001  # the original's own work: not part of the next step's start
        return {"outputs": model_runner_output}

    def has_requests(self) -> bool:
        return self.remaining > 0


def output(batch: int, k: int, drafts_next: int | None = None) -> Any:
    """A step of ``batch`` requests verifying ``k`` drafts and drafting ``drafts_next`` for the
    next (None: k, a steady run)."""
    ids = [f"r{i}" for i in range(batch)]
    return SimpleNamespace(
        num_scheduled_tokens=dict.fromkeys(ids, 1 + k),
        total_num_scheduled_tokens=batch * (1 + k),
        scheduled_spec_decode_tokens={i: [-1] * k for i in ids} if k else {},
        num_spec_tokens_to_schedule=k if drafts_next is None else drafts_next,
    )


def install_fake_vllm(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> tuple[type, type, type[FakeScheduler]]:
    class CudaGraphManager:
        def _init_candidates(self) -> None:
            pass

    class EngineCore:
        pass

    class Scheduler(FakeScheduler):
        pass

    modules = {
        "vllm": types.ModuleType("vllm"),
        "vllm.v1": types.ModuleType("vllm.v1"),
        "vllm.v1.worker": types.ModuleType("vllm.v1.worker"),
        "vllm.v1.worker.gpu": types.ModuleType("vllm.v1.worker.gpu"),
        "vllm.v1.worker.gpu.cudagraph_utils": types.ModuleType("cudagraph_utils"),
        "vllm.v1.engine": types.ModuleType("vllm.v1.engine"),
        "vllm.v1.engine.core": types.ModuleType("core"),
        "vllm.v1.core": types.ModuleType("vllm.v1.core"),
        "vllm.v1.core.sched": types.ModuleType("vllm.v1.core.sched"),
        "vllm.v1.core.sched.scheduler": types.ModuleType("scheduler"),
    }
    modules["vllm.v1.core.sched.scheduler"].Scheduler = Scheduler  # type: ignore[attr-defined]
    modules["vllm"].__version__ = version  # type: ignore[attr-defined]
    modules["vllm.v1.worker.gpu"].cudagraph_utils = modules["vllm.v1.worker.gpu.cudagraph_utils"]  # type: ignore[attr-defined]
    modules["vllm.v1.worker.gpu.cudagraph_utils"].CudaGraphManager = CudaGraphManager  # type: ignore[attr-defined]
    modules["vllm.v1.engine.core"].EngineCore = EngineCore  # type: ignore[attr-defined]
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return CudaGraphManager, EngineCore, Scheduler


def test_other_vllm_versions_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    manager, core, scheduler = install_fake_vllm(monkeypatch, "0.27.0")
    engine.register()
    assert not getattr(manager._init_candidates, PATCHED_MARK, False)
    assert not hasattr(core, wire.GET_TABLE)
    assert not getattr(scheduler.update_from_output, engine.TIMED_MARK, False)


def test_on_026_wraps_and_adds_the_utilities(monkeypatch: pytest.MonkeyPatch) -> None:
    manager, core_cls, _ = install_fake_vllm(monkeypatch, "0.26.0")
    engine.register()
    engine.register()  # loaded again in the same process: still one wrap
    assert getattr(manager._init_candidates, PATCHED_MARK)
    assert not getattr(manager._init_candidates.__wrapped__, PATCHED_MARK, False)

    core: Any = core_cls()
    shaped = fake_core()
    core.scheduler, core.vllm_config = shaped.scheduler, shaped.vllm_config
    assert getattr(core, wire.GET_TABLE)()["view"]["table"] == START
    answer = getattr(core, wire.PUT_TABLE)({"table": [[1, 256, 1]]}, 0)
    assert answer["status"] == 200 and core.scheduler.dynamic_sd_lookup[7] == 1
    assert getattr(core, wire.PUT_SETTINGS)({"hysteresis": 2}, 1)["view"]["hysteresis"] == 2


def test_compat_fix_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    manager, core, _ = install_fake_vllm(monkeypatch, "0.26.0")
    monkeypatch.setenv("TABLETUNE_COMPAT_FIX", "0")
    engine.register()
    assert not getattr(manager._init_candidates, PATCHED_MARK, False)
    assert hasattr(core, wire.PUT_TABLE)


def clocked_scheduler(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[float]]:
    """A registered fake scheduler whose wrapper reads a clock the test moves."""
    _, _, scheduler_cls = install_fake_vllm(monkeypatch, "0.26.0")
    engine.register()
    engine.register()  # loaded again: still one wrap
    assert getattr(scheduler_cls.update_from_output, engine.TIMED_MARK)
    assert not getattr(scheduler_cls.update_from_output.__wrapped__, engine.TIMED_MARK, False)
    clock = [100.0]
    monkeypatch.setattr(engine.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(engine.time, "time", lambda: 1.7e9)
    return scheduler_cls(clock), clock


def test_every_update_from_output_is_timed_into_its_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    scheduler, clock = clocked_scheduler(monkeypatch)
    for _ in range(3):
        assert scheduler.update_from_output(output(130, 3), "runner") == {"outputs": "runner"}
        clock[0] += 0.019  # + the original's 1 ms: 20 ms between calls
    timer = engine.step_timer_of(scheduler)
    totals = timer.counter.totals()[(3, 129, 136)]
    assert scheduler.calls == 3 and totals.steps == 2
    assert totals.seconds == pytest.approx(0.040) and totals.tokens == 2 * 130 * 4
    assert timer.started_at == 1.7e9


def test_the_step_after_the_scheduler_emptied_is_not_timed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduler, clock = clocked_scheduler(monkeypatch)
    scheduler.update_from_output(output(4, 1), None)
    scheduler.remaining = 0  # the last request finished in this step
    clock[0] += 0.01
    scheduler.update_from_output(output(4, 1), None)
    scheduler.remaining = 1
    clock[0] += 30.0  # idle, then a new request
    scheduler.update_from_output(output(4, 1), None)
    assert engine.step_timer_of(scheduler).counter.totals()[(1, 4, 4)].steps == 1


def test_switched_off_the_wrapper_only_calls_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    scheduler, clock = clocked_scheduler(monkeypatch)
    timer = engine.step_timer_of(scheduler)
    timer.set_enabled(False)
    for _ in range(3):
        scheduler.update_from_output(output(4, 1), None)
        clock[0] += 0.01
    assert scheduler.calls == 3 and timer.counter.totals() == {}


def test_the_step_cells_utility_answers_the_timers_wire_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, core_cls, _ = install_fake_vllm(monkeypatch, "0.26.0")
    engine.register()
    core: Any = core_cls()
    shaped = fake_core()
    core.scheduler, core.vllm_config = shaped.scheduler, shaped.vllm_config
    timer = engine.step_timer_of(core.scheduler)
    timer.on_step(0.0, {"a": 1}, 1, {}, idle_after=False, drafts_next=0)
    timer.on_step(0.25, {"a": 1}, 1, {}, idle_after=False, drafts_next=0)
    answer = getattr(core, wire.GET_STEP_CELLS)()
    assert answer == timer.to_wire() and answer["cells"] == [[0, 1, 1, 1.0, 0.25, 0.0625, 1.0, 1.0]]
    # The controller built later switches the same timer.
    getattr(core, wire.PUT_SETTINGS)({"step_timing": False}, None)
    assert not timer.enabled


def ran(batch: int, kept_per_request: int) -> Any:
    """A ``ModelRunnerOutput`` as the wrapper reads it: each request's sampled tokens."""
    return SimpleNamespace(sampled_token_ids=[[7] * kept_per_request for _ in range(batch)])


def test_the_bandit_learns_from_each_timed_step_its_kept_tokens_per_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduler, clock = clocked_scheduler(monkeypatch)
    bandit = NightjarLookup([1, 3], max_num_seqs=256, exploration=0.0)
    scheduler.dynamic_sd_lookup = bandit
    # k=3 then k=1, each for 3 steps of 20 ms: the first call and the switch (the third k=3
    # step, drafting 1) teach nothing.
    plan = ((3, 3, 3), (3, 3, 3), (3, 1, 3), (1, 1, 2), (1, 1, 2), (1, 1, 2))
    for k, drafts_next, kept in plan:
        scheduler.update_from_output(output(8, k, drafts_next), ran(8, kept))
        clock[0] += 0.019
    assert bandit.rewarded_steps == 4  # step 2 at k=3; steps 4, 5, 6 at k=1
    assert bandit.table_k(8) == 3  # 24 tokens per 20 ms (reward 1) beat 16 (2/3)
    cells = engine.step_timer_of(scheduler).counter
    assert cells.switch_steps == 1 and sum(t.steps for t in cells.totals().values()) == 4


def test_with_a_table_the_runner_output_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    scheduler, clock = clocked_scheduler(monkeypatch)
    scheduler.dynamic_sd_lookup = [3] * 257
    for _ in range(3):
        scheduler.update_from_output(output(8, 3), object())  # no sampled_token_ids
        clock[0] += 0.019
    assert engine.step_timer_of(scheduler).counter.totals()[(3, 8, 8)].steps == 2
