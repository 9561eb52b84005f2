"""bench/gpu/shift_replay.py: the traffic-shift check replayed on recorded daemon parts."""

from __future__ import annotations

from typing import Any

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
