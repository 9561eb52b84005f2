"""bench/gpu/shift_replay.py: the traffic-shift check replayed on recorded daemon parts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tabletune.step_cells import CellTotals, cells_to_wire
from tests.support.gpu_jobs import load_gpu_module

shift_replay = load_gpu_module("shift_replay")
PROFILE = "profiles/h200-qwen3-4b-eagle3-inflight.json"


def _window(part: str, step_s: float, spread: float = 0.1) -> dict[str, Any]:
    """One second of k=2 at B=126 (cell 121-128): steps of ``step_s`` spread ``spread``."""
    steps = round(1.0 / step_s)
    seconds = steps * step_s
    squares = steps * step_s**2 * (1 + spread**2)
    cells = {(2, 121, 128): CellTotals(steps, seconds, squares, steps * 400, steps * 126)}
    return {"part": part, "wall_s": 1.0, "cells": cells_to_wire(cells, 0.0)}


def _raw(windows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"meta": {"target": "qwen3-4b", "daemon": {"profile": PROFILE}}, "windows": windows}


def test_steady_steps_read_no_change_and_slower_ones_do() -> None:
    steady = [_window("decode-heavy-B128-daemon", 0.012) for _ in range(60)]
    slower = steady[:30] + [_window("decode-heavy-B128-daemon", 0.018) for _ in range(30)]
    change = [_window("change-decode-heavy-chat-like-B192-daemon", 0.012)]
    (part,) = shift_replay.replay(_raw(steady + change), "steady.json")
    assert part == {"raw": "steady.json", "part": "decode-heavy-B128-daemon", "shifts_at_s": []}
    (part,) = shift_replay.replay(_raw(slower), "slower.json")
    assert part["shifts_at_s"] and 30.0 < part["shifts_at_s"][0] <= 36.0


def test_h200_b254_a_rollback_of_the_tables_k_is_not_read_as_a_shift() -> None:
    # Issue 16's decode-heavy B≈254 part at e5e4c6f (03:38 UTC): k=1 pushed at 38 s, rolled
    # back to k=0 at 47.1 s; k=0's steps 4.7 s later read as a shift, and what k=1's run had
    # shown was forgotten. Within STEP_TIME__SETTLE_S of the cell's change of k: none.
    name = "eval_traffic_decode_heavy_b256_priced_200s_blocks_h200_20261202T0338Z.json"
    path = Path(__file__).resolve().parents[2] / "bench/results/gpu_raw" / name
    (part,) = shift_replay.replay(json.loads(path.read_text()), name)
    assert part["part"] == "decode-heavy-B256-daemon" and part["shifts_at_s"] == []


@pytest.mark.parametrize(
    ("name", "read_at_0_15"),
    [
        ("eval_traffic_decode_heavy_b256_priced_acceptance_again_blocks_h200_20261202T0833Z.json",
         35.8),
        ("eval_traffic_decode_heavy_b256_unproven_blocks_h200_20261202T1301Z.json", 54.8),
    ],
    ids=["08:33", "13:01"],
)  # fmt: skip
def test_h200_b254_steady_traffic_reads_no_change_at_the_default(
    name: str, read_at_0_15: float
) -> None:
    # Steady decode-heavy B≈254: its running k's steps wander up to 60 % cycle to cycle; with
    # STEP_TIME__SHIFT at 0.15 (the default until 2026-12-02) the check read a change here
    # (at read_at_0_15 s), as in 11 of 56 steady parts; the recorded shape changes moved
    # the running k by 76-183 %.
    path = Path(__file__).resolve().parents[2] / "bench/results/gpu_raw" / name
    (part,) = shift_replay.replay(json.loads(path.read_text()), name)
    assert part["shifts_at_s"] == []
    (part,) = shift_replay.replay(json.loads(path.read_text()), name, shift=0.15)
    assert part["shifts_at_s"] == [read_at_0_15]
