"""bench/explore_cost_sim.py: what exploring costs the daemon over minutes, on the emulator."""

from __future__ import annotations

import json
from typing import Any

import pytest
from bench import explore_cost_sim
from bench.explore_cost_sim import run_summary


def cycle(at_s: float, table_k: int, loss: float, bursts: bool, best_k: int = 2) -> dict[str, Any]:
    return {"at_s": at_s, "table_k": table_k, "best_k": best_k, "steps_loss": loss,
            "burst_spacing": 32 if bursts else 0}  # fmt: skip


def test_a_run_is_read_from_the_last_stretch_on_the_best_k() -> None:
    """Right at 30 s, wrong again at 45 s, right for good from 60 s: the cycle that pushed it
    (60 s) ran the old table, so the steps' loss once right is read from 75 s on."""
    cycles = [
        cycle(15, 3, 0.20, True), cycle(30, 2, 0.20, True), cycle(45, 1, 0.05, True),
        cycle(60, 2, 0.10, True), cycle(75, 2, 0.02, True), cycle(120, 2, 0.01, False),
        cycle(135, 2, 0.004, False), cycle(150, 2, 0.03, True),
    ]  # fmt: skip
    out = run_summary(cycles, table_loss=0.0)
    assert out["right_table_from_s"] == 60
    assert out["steps_loss_once_right"] == pytest.approx(round((0.02 + 0.01 + 0.004 + 0.03) / 4, 4))
    assert out["steps_loss_late"] == pytest.approx(round((0.004 + 0.03) / 2, 4))
    assert out["steps_loss_late_without_bursts"] == 0.004
    assert out["late_cycles_with_bursts"] == 0.5


def test_a_run_never_on_the_best_k_has_no_reading_once_right() -> None:
    out = run_summary([cycle(15, 3, 0.2, True), cycle(135, 1, 0.1, True)], table_loss=0.1)
    assert out["right_table_from_s"] is None and out["steps_loss_once_right"] is None


def test_a_quick_run_writes_its_smoke_result_beside_the_committed_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setattr("bench.common.RESULTS", tmp_path)
    monkeypatch.setattr(explore_cost_sim, "QUICK_LOADS", (64,))
    assert explore_cost_sim.main(["--quick", "--seeds", "1", "--horizon-s", "150"]) == 0
    written = json.loads((tmp_path / "raw" / "explore_cost_sim_quick.json").read_text())
    runs = written["per_load"]["64"]["default"]["runs"]
    assert len(runs) == 1 and runs[0]["right_table_from_s"] is not None
    assert not (tmp_path / "explore_cost_sim.json").exists()


@pytest.mark.parametrize("flags", [["--seeds", "0"], ["--horizon-s", "120"]])
def test_bad_flags_are_refused(flags: list[str]) -> None:
    with pytest.raises(SystemExit):
        explore_cost_sim.main(flags)
