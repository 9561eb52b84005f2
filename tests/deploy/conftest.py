"""Helpers for the deployment checks: each file is checked by the real tool that will read it.

A missing tool skips the test locally, but fails it when TABLETUNE_REQUIRE_SERVERS=1 (CI sets it,
and .ci/run installs the tools), so a green CI always means the tools really ran.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SYSTEMD = REPO / "systemd"


# kubectl (kustomize) comes with this machine image, from neither Debian nor PyPI, so .ci/run cannot
# install it: where it is missing its checks skip even in CI, and the tool-free kustomization
# check in test_kubernetes.py still runs.
NOT_INSTALLABLE = frozenset({"kubectl"})


def _tool_path(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if name in NOT_INSTALLABLE:
            pytest.skip(f"{name} is not installed and cannot be installed by .ci/run")
        message = f"{name} is not installed (CI installs it in .ci/run)"
        if os.environ.get("TABLETUNE_REQUIRE_SERVERS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture
def tool() -> Callable[[str], str]:
    """``tool("promtool")`` -> its path, or skip/fail as described above."""
    return _tool_path


def run_tool(args: Sequence[str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run a checker, never raising on its exit code: tests assert on it with its output."""
    return subprocess.run(
        list(args), cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def explain(result: subprocess.CompletedProcess[str]) -> str:
    return f"$ {' '.join(result.args)}\n{result.stdout}\n{result.stderr}"
