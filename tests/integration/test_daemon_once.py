"""``tabletune daemon --once`` as a script or a probe runs it: exit 0 only when the cycle observed
a replica and saved its state; otherwise exit 1 with the reason on stderr and in the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tabletune.demo.emulator import emulator

pytestmark = pytest.mark.integration
PROFILE = Path(__file__).resolve().parents[2] / "examples" / "sample-profile.json"


def once(env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TABLETUNE_")}
    done = subprocess.run(
        [sys.executable, "-m", "tabletune.cli.main", "daemon", "--once"],
        env={**base, "TABLETUNE_PROFILE__PATHS": str(PROFILE), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = json.loads(done.stdout) if done.stdout.strip() else {}
    return done, report


def test_nothing_observed_is_a_failure_with_its_reason(tmp_path: Path) -> None:
    done, report = once(
        {
            "TABLETUNE_SOURCE__REPLICAS": "http://127.0.0.1:9",
            "TABLETUNE_STATE__DIR": str(tmp_path / "state"),
            "TABLETUNE_LOOP__INTERVAL_S": "0.1",
            "TABLETUNE_SERVER__PORT": "0",
            "TABLETUNE_ADMIN__TOKEN": "old-name-0123456789abcdef",
        }
    )
    assert done.returncode == 1, done.stderr
    assert report["ok"] is False and "no replica observed" in str(report["problem"])
    assert "tabletune daemon --once: no replica observed (http://127.0.0.1:9" in done.stderr
    warnings = [json.loads(line) for line in done.stderr.splitlines() if '"warning"' in line]
    assert any("TABLETUNE_ADMIN__TOKEN is deprecated" in str(w["event"]) for w in warnings)
    assert "old-name-0123456789abcdef" not in done.stderr


def test_observed_and_saved_is_ok_and_an_unsaved_state_is_not(tmp_path: Path) -> None:
    with emulator(scenario="repair", profile=PROFILE, speed=20.0) as sim:
        common = {
            "TABLETUNE_SOURCE__REPLICAS": sim,
            "TABLETUNE_LOOP__INTERVAL_S": "0.5",
            "TABLETUNE_SERVER__PORT": "0",
        }
        done, report = once({**common, "TABLETUNE_STATE__DIR": str(tmp_path / "state")})
        assert done.returncode == 0, done.stderr
        assert report["ok"] is True and report["problem"] is None and report["observed"]
        blocked = tmp_path / "not-a-directory"
        blocked.write_text("")
        done, report = once({**common, "TABLETUNE_STATE__DIR": str(blocked)})
    assert done.returncode == 1, done.stderr
    assert report["ok"] is False and report["problem"] == (
        "the state could not be saved (see the log)"
    )
