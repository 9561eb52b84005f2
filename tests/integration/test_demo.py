"""``tabletune demo`` end to end, shortened: emulator, daemon, ground truth, summary, PNG."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tabletune.demo.emulator import emulator
from tabletune.errors import TemporaryError

pytestmark = pytest.mark.integration


def test_demo_outside_a_checkout_repairs_the_table_and_writes_a_png(tmp_path: Path) -> None:
    png = tmp_path / "out" / "demo.png"  # a folder that does not exist yet
    command = ["demo", "--speed", "40", "--duration", "240", "--png", str(png)]
    done = subprocess.run(
        [sys.executable, "-m", "tabletune.cli.main", *command],
        cwd=tmp_path,  # no profiles/ or examples/ here: the packaged sample profile is used
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "sample-profile.json" in lines[0]
    cycles = [line for line in lines if line.startswith("t=")]
    assert len(cycles) >= 10
    assert all("a_hat=" in line and "goodput " in line for line in cycles)  # piped: every cycle
    assert "a_hat=(0." in cycles[-1] and "of the oracle" in cycles[-1]
    summary = next(line for line in lines if line.startswith("demo:"))
    assert "never" not in summary
    measured = re.search(
        r"(\d+\.\d)% of the oracle before the first push, (\d+\.\d)% after", summary
    )
    assert measured, summary
    before, after = (float(x) for x in measured.groups())
    assert before < 80.0 < after  # the start hurts, the repair shows in the measured goodput
    assert png.stat().st_size > 10_000


def test_an_emulator_that_cannot_start_gives_its_own_error(tmp_path: Path) -> None:
    with (
        pytest.raises(TemporaryError, match=r"exited with 2: .*missing\.json"),
        emulator(scenario="repair", profile=tmp_path / "missing.json", speed=1.0),
    ):
        pass
