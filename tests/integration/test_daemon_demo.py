"""``tabletune demo`` end to end, shortened: emulator, daemon, ground truth, summary, PNG."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_demo_repairs_the_table_and_writes_a_png(tmp_path: Path) -> None:
    png = tmp_path / "demo.png"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tabletune.cli.main",
            "demo",
            "--speed",
            "40",
            "--duration",
            "240",
            "--png",
            str(png),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = [line for line in done.stdout.splitlines() if line.startswith("demo:")]
    assert summary, done.stdout[-2000:]
    assert "1 push(es)" in done.stdout
    assert "within" in done.stdout and "never" not in done.stdout
    assert png.stat().st_size > 10_000
