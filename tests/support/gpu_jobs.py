"""Dry runs of the GPU jobs under bench/gpu on a CPU: the job script run against the vLLM
stand-in (tests/support/vllm_stand_in.py), and its report module loaded by path."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "bench" / "gpu"


def load_gpu_module(name: str) -> ModuleType:
    """``bench/gpu/<name>.py`` as a module (the folder is no package), registered under its
    name: the folder's scripts import each other by name, and dataclasses look their module up."""
    spec = importlib.util.spec_from_file_location(name, GPU / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def dry_run(script: str, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``bench/gpu/<script>`` against the stand-in on a free port, results under ``out``."""
    full = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # python3 = this one
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
        "WHEEL": "none",
        "SERVER_MODULE": "tests.support.vllm_stand_in",
        "PORT": str(free_port()),
        "OUT": str(out),
        "COMMIT": "dry-run",
        **env,
    }
    full.pop("TABLETUNE_ADMIN_TOKEN", None)
    return subprocess.run(
        ["bash", str(GPU / script)], env=full, capture_output=True, text=True, timeout=240
    )
