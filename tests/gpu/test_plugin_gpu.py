"""Real vLLM 0.26 on a GPU: the whole plugin check (bench/gpu/plugin_check.sh main).

Needs vLLM 0.26 with this package installed into its environment and the dummy-weight model
config folders under /tmp/models (qwen3-4b, qwen3-4b-eagle3). Skipped elsewhere (CI has no GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.gpu
@pytest.mark.timeout(900)
def test_plugin_check_passes_on_real_vllm(tmp_path: Path) -> None:
    vllm = pytest.importorskip("vllm")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or not str(vllm.__version__).startswith("0.26."):
        pytest.skip("needs a GPU and vLLM 0.26")
    if not Path("/tmp/models/qwen3-4b").is_dir():
        pytest.skip("dummy model configs not in /tmp/models")
    env = {**os.environ, "OUT": str(tmp_path)}
    subprocess.run(["bash", str(ROOT / "bench/gpu/plugin_check.sh"), "main"], env=env, check=True)
    result = json.loads((tmp_path / "plugin_check.json").read_text())
    failed = [check["name"] for check in result["checks"] if not check["ok"]]
    assert result["all_ok"], failed
    assert result["config"]["nofix_zero_division_lines"] > 0  # the start without the fix crashed
