"""bench/gpu/change_replay.py: the shape change's daemon part through this checkout's decision."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tabletune.step_cells import CellTotals, cells_to_wire
from tests.support.gpu_jobs import load_gpu_module

load_gpu_module("shift_replay")  # the cycles it replays in
load_gpu_module("live_daemon_report")  # the k the engine captured
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


def _settling_raw() -> dict[str, Any]:
    """19:43 on the H200 in small: k=1 at 185-192 under decode-heavy, the change (k=1's steps
    slow, prompts ride along), k=3 run 6 s in the transient at 55 ms, then k=1 again."""
    k1_before = [(1, 0.015, 0)] * 12
    k1_after = [(1, 0.030, 1200)] * 6
    k3 = [(3, 0.055, 1200)] * 6
    k1_again = [(1, 0.030, 1200)] * 30
    windows = []
    for i, (k, step_s, prefill) in enumerate(k1_before + k1_after + k3 + k1_again):
        table = [[1, 184, 1], [185, 192, k], [193, 256, 1]]
        cells = {(k, 185, 192): _cells(k, 188, int(1.0 / step_s), step_s, prefill)}
        windows.append({"part": f"{PART}-daemon", "wall_s": 1.0,
                        "since_daemon_start_s": 25.0 + i, "cells": cells_to_wire(cells, 0.0),
                        "view": {"table": table}})  # fmt: skip
    return {**_raw(), "windows": windows}


def test_a_k_run_in_the_transient_after_a_change_is_sent_bursts_again_once_it_settled() -> None:
    def bursts_of_k3_late(settle_s: str) -> list[float]:
        cycles = change_replay.replay(
            _settling_raw(), setting_changes={"STEP_TIME__SETTLE_S": settle_s}
        )
        late = (c for c in cycles if c["since_change_s"] > 14)  # past the k=3 stint
        return [c["since_change_s"] for c in late if 3 in c["bursts_at"]]

    assert bursts_of_k3_late("15") and not bursts_of_k3_late("0")


def test_a_setting_given_on_the_command_line_is_replayed_and_recorded(tmp_path: Path) -> None:
    raw = tmp_path / "eval_traffic_change_blocks.json"
    raw.write_text(json.dumps(_settling_raw()))
    out = tmp_path / "replay.json"
    assert change_replay.main([str(raw), "--setting", "STEP_TIME__SETTLE_S=0",
                               "--out", str(out)]) == 0  # fmt: skip
    result = json.loads(out.read_text())
    assert result["settings"] == {"STEP_TIME__SETTLE_S": "0"}
    late = (c for c in result["changes"][0]["cycles"] if c["since_change_s"] > 14)
    assert not any(3 in c["bursts_at"] for c in late)  # as replay() with settling off


@pytest.mark.parametrize("setting", [
    "STEP_TIME__SETTLE_S",  # no value
    "STEP_TIME__SETTLE_S=-1",  # out of range
    "STEP_TIME__SETTLE=15",  # no such setting: a typo would otherwise replay the defaults
    "TABLETUNE_STEP_TIME__SETTLE_S=0",  # the prefix is the script's to add
])  # fmt: skip
def test_a_bad_setting_is_a_one_line_error_and_writes_nothing(
    setting: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tmp_path / "eval_traffic_change_blocks.json"
    raw.write_text(json.dumps(_settling_raw()))
    out = tmp_path / "replay.json"
    with pytest.raises(SystemExit) as stopped:
        change_replay.main([str(raw), "--setting", setting, "--out", str(out)])
    assert stopped.value.code == 2
    assert "--setting" in capsys.readouterr().err
    assert not out.exists()


def test_every_k_the_engine_captured_may_be_pushed_not_only_those_the_running_table_has() -> None:
    # The plugin allows every k of the engine's starting table; the table in force after a
    # change (here k=3 only) need not hold them. k=1 running fast at 185-192 must be takeable.
    def window(since: float) -> dict[str, Any]:
        cells = {(3, 185, 192): _cells(3, 188, 20, 0.060, 1200),
                 (1, 185, 192): _cells(1, 188, 12, 0.020, 1200)}  # fmt: skip
        return {"part": f"{PART}-daemon", "wall_s": 1.0, "since_daemon_start_s": since,
                "cells": cells_to_wire(cells, 0.0), "view": {"table": [[1, 256, 3]]}}  # fmt: skip

    raw = {**_raw(), "windows": [window(37.0 + i) for i in range(12)]}
    raw["meta"]["starting_table"] = [[1, 1, 0], [2, 2, 1], [3, 3, 2], [4, 256, 3]]
    pushed = [c for c in change_replay.replay(raw) if c["push"]]
    assert pushed, "k=1 at a third of k=3's step time is never taken"
    assert next(k for start, end, k in pushed[-1]["new"] if start <= 188 <= end) == 1
