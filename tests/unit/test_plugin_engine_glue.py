"""``register()`` against stand-in vLLM modules: version gate, compat wrap, EngineCore methods."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from tabletune.plugin import engine, wire
from tabletune.plugin.compat import PATCHED_MARK

from .test_plugin_controller import START, fake_core


def install_fake_vllm(monkeypatch: pytest.MonkeyPatch, version: str) -> tuple[type, type]:
    class CudaGraphManager:
        def _init_candidates(self) -> None:
            pass

    class EngineCore:
        pass

    modules = {
        "vllm": types.ModuleType("vllm"),
        "vllm.v1": types.ModuleType("vllm.v1"),
        "vllm.v1.worker": types.ModuleType("vllm.v1.worker"),
        "vllm.v1.worker.gpu": types.ModuleType("vllm.v1.worker.gpu"),
        "vllm.v1.worker.gpu.cudagraph_utils": types.ModuleType("cudagraph_utils"),
        "vllm.v1.engine": types.ModuleType("vllm.v1.engine"),
        "vllm.v1.engine.core": types.ModuleType("core"),
    }
    modules["vllm"].__version__ = version  # type: ignore[attr-defined]
    modules["vllm.v1.worker.gpu"].cudagraph_utils = modules["vllm.v1.worker.gpu.cudagraph_utils"]  # type: ignore[attr-defined]
    modules["vllm.v1.worker.gpu.cudagraph_utils"].CudaGraphManager = CudaGraphManager  # type: ignore[attr-defined]
    modules["vllm.v1.engine.core"].EngineCore = EngineCore  # type: ignore[attr-defined]
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return CudaGraphManager, EngineCore


def test_other_vllm_versions_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    manager, core = install_fake_vllm(monkeypatch, "0.27.0")
    engine.register()
    assert not getattr(manager._init_candidates, PATCHED_MARK, False)
    assert not hasattr(core, wire.GET_TABLE)


def test_on_026_wraps_and_adds_the_utilities(monkeypatch: pytest.MonkeyPatch) -> None:
    manager, core_cls = install_fake_vllm(monkeypatch, "0.26.0")
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
    manager, core = install_fake_vllm(monkeypatch, "0.26.0")
    monkeypatch.setenv("TABLETUNE_COMPAT_FIX", "0")
    engine.register()
    assert not getattr(manager._init_candidates, PATCHED_MARK, False)
    assert hasattr(core, wire.PUT_TABLE)
