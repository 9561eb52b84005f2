"""bench/gpu/burst_vs_run.py: where a burst's cost may land (the steps at a new k)."""

from __future__ import annotations

from typing import Any

from tests.support.gpu_jobs import load_gpu_module

burst_vs_run = load_gpu_module("burst_vs_run")


def _window(part: str, cells: list[list[float]], switches: tuple[int, float]) -> dict[str, Any]:
    return {"part": part, "arm": "daemon",
            "cells": {"cells": cells, "steps_without_decode": 0,
                      "switch_steps": switches[0], "switch_seconds": switches[1]}}  # fmt: skip


def test_the_steps_at_a_new_k_are_set_beside_the_running_steps() -> None:
    # k=0 runs at 249-256 (17 ms a step), k=1 bursts: 6 steps at a new k took 40 ms each.
    running = [0, 249, 256, 100, 1.7, 0.03, 25_400, 25_400]
    burst = [1, 249, 256, 6, 0.16, 0.005, 3000, 1500]
    raw = {"windows": [
        _window("decode-heavy-B256-daemon", [running, burst], (4, 0.16)),
        _window("decode-heavy-B256-daemon", [running], (2, 0.08)),
        _window("decode-heavy-B256-arms", [running], (0, 0.0)),
        _window("long-context-B160-daemon", [running], (0, 0.0)),  # none counted: left out
    ]}  # fmt: skip
    assert burst_vs_run.switch_steps(raw) == [
        {"load": "decode-heavy-B256", "switch_steps": 6, "switch_ms": 40.0, "running_ms": 17.0}
    ]
