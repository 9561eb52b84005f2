"""The emulator evaluations rerun, by their plain commands, on the profile their committed
results were computed on (not whichever measured profile sorts first in profiles/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("module", "result"),
    [("bench.evaluate", "eval_emulator.json"), ("bench.daemon_bench", "daemon_bench.json")],
)
def test_a_plain_rerun_uses_the_profile_its_committed_result_names(
    module: str, result: str
) -> None:
    default_profile = __import__(module, fromlist=["default_profile"]).default_profile
    committed = json.loads((ROOT / "bench" / "results" / result).read_text())
    named = committed["profile"]
    named = named["path"] if isinstance(named, dict) else named
    assert default_profile().relative_to(ROOT).as_posix() == named
