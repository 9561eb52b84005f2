"""bench/gpu/change_replay.py: the shape change's daemon part through this checkout's decision."""

from __future__ import annotations

from typing import Any

from tabletune.step_cells import CellTotals, cells_to_wire
from tests.support.gpu_jobs import load_gpu_module

load_gpu_module("shift_replay")  # the cycles it replays in
change_replay = load_gpu_module("change_replay")
PROFILE = "profiles/h200-qwen3-4b-eagle3-inflight.json"
PART = "change-decode-heavy-chat-like-B192"
RAN = [[1, 176, 3], [177, 184, 0], [185, 256, 3]]  # k=0 where only a few steps ran


def _cells(k: int, batch: int, steps: int, step_s: float, prefill: int) -> CellTotals:
    return CellTotals(steps, steps * step_s, steps * step_s**2 * 1.01,
                      steps * (batch * (1 + k) + prefill), steps * batch)  # fmt: skip


def _window(since: float) -> dict[str, Any]:
    """A second of chat-like traffic at 192 clients after the change: k=3 at 185-192 carrying
    ~1,200 prompt tokens a step, and a few k=1 steps at 177-184 carrying 180."""
    cells = {(3, 185, 192): _cells(3, 188, 22, 0.045, 1200),
             (1, 177, 184): _cells(1, 180, 2, 0.038, 180)}  # fmt: skip
    return {"part": f"{PART}-daemon", "wall_s": 1.0, "since_daemon_start_s": since,
            "cells": cells_to_wire(cells, 0.0), "view": {"table": RAN}}  # fmt: skip


def _raw() -> dict[str, Any]:
    return {
        "meta": {"target": "qwen3-4b", "synthetic_rates": [0.75, 0.55, 0.40],
                 "daemon": {"profile": PROFILE}},
        "shape_change": {"part": PART, "at_s": 36.0, "clients": 192},
        "windows": [_window(37.0 + i) for i in range(12)],
    }  # fmt: skip


def test_each_cycle_is_decided_against_the_table_the_live_window_ran() -> None:
    cycles = change_replay.replay(_raw())
    assert [c["since_change_s"] for c in cycles] == [3.0, 6.0, 9.0, 12.0]
    assert all(c["ran"] == RAN for c in cycles)
    # The few k=1 steps at 177-184 leave the graph with the replica's prompt tokens, and so
    # would k=0: it stands on k=1's live ratio, not the profile's pure-decode time, and the
    # decision takes it out of the table.
    pushed = [c for c in cycles if c["push"]]
    assert pushed, [c["reason"] for c in cycles]
    new = pushed[0]["new"]
    assert next(k for start, end, k in new if start <= 180 <= end) != 0


def test_a_batch_weight_is_the_steps_at_each_cells_mean_batch() -> None:
    cells = {(3, 185, 192): _cells(3, 188, 22, 0.045, 1200),
             (1, 185, 192): _cells(1, 188, 3, 0.03, 1200),
             (1, 177, 184): _cells(1, 180, 2, 0.038, 180)}  # fmt: skip
    assert change_replay.batch_weights(cells) == {188: 25.0, 180: 2.0}
