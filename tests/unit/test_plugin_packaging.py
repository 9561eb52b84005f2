"""The three entry points vLLM loads exist, and importing the plugin never imports vLLM."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
EXPECTED = {
    "vllm.general_plugins": "tabletune_engine",
    "vllm.endpoint_plugins": "tabletune_http",
    "vllm.stat_logger_plugins": "tabletune_metrics",
}


@pytest.mark.parametrize(("group", "name"), sorted(EXPECTED.items()))
def test_entry_point_declared_and_importable(group: str, name: str) -> None:
    entry_points = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"]
    target = entry_points[group][name]
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    if group != "vllm.stat_logger_plugins":  # that one is built from vLLM's base on access
        assert callable(getattr(module, attribute))


def test_plugin_modules_import_without_vllm() -> None:
    code = (
        "import sys\n"
        "import tabletune.plugin.engine, tabletune.plugin.http, tabletune.plugin.metrics\n"
        "assert not any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules), 'vllm'\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
