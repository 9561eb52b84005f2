"""bench/gpu/step_trace_report.py: steps one by one from the plugin's step trace, set beside an
evaluation's windows (a run of k, and bursts of k inside another k's run)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tabletune.plugin.step_trace import HEADER, trace_line
from tests.support.gpu_jobs import load_gpu_module

report = load_gpu_module("step_trace_report")

START = 1.8e9
PURE_S = {0: 0.016, 1: 0.018}  # a step that only decodes, by k
TAKING_S = 0.006  # once per step that takes prompts in, however many


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def _trace(plan: list[tuple[int, int]]) -> tuple[str, float]:
    """The trace of back-to-back steps at batch 250, one per (k, new requests) in ``plan``;
    each new request brings a 56-token prompt. Returns the text and the last step's time."""
    lines = [HEADER]
    t = START
    lines.append(trace_line(t, {"a": 1}, 1, {}, new_requests=0, finished_requests=0,
                            idle_after=False))  # fmt: skip
    for k, new in plan:
        t += PURE_S[k] + (TAKING_S if new else 0.0)
        decodes = {f"r{i}": 1 + k for i in range(250 - new)}
        prompts = {f"p{i}": 56 for i in range(new)}
        spec = {r: [0] * k for r in decodes} if k else {}
        scheduled = decodes | prompts
        lines.append(trace_line(t, scheduled, sum(scheduled.values()), spec, new_requests=new,
                                finished_requests=0, idle_after=False))  # fmt: skip
    return "".join(lines), t


def test_steps_taking_prompts_are_told_apart_and_bursts_corrected_to_their_run() -> None:
    # A run of k=1 (a fixed arm): prompts come in every other step. Then a daemon window of
    # k=0's run with bursts of k=1 (3 steps of 32) that take prompts in one step of 8.
    run = [(1, 1 + (i % 3 == 0)) if i % 2 else (1, 0) for i in range(400)]
    daemon: list[tuple[int, int]] = []
    for i in range(60 * 32):
        k = 1 if i % 32 < 3 else 0
        daemon.append((k, 1 if i % 8 == 0 else 0))
    text, run_end = _trace(run + daemon)
    boundary = START + sum(PURE_S[1] + (TAKING_S if n else 0) for _, n in run) + 1e-4
    raw = {"meta": {}, "windows": [
        {"part": "decode-heavy-B256-arms", "arm": "k1",
         "started_utc": _utc(START), "ended_utc": _utc(boundary)},
        {"part": "decode-heavy-B256-daemon", "arm": "live",
         "started_utc": _utc(boundary), "ended_utc": _utc(run_end + 1)},
    ]}  # fmt: skip
    out = report.report(raw, text)
    groups = {(g["load"], g["kind"], g["k"]): g for g in out["groups"]}
    run_k1 = groups[("decode-heavy-B256", "run", 1)]
    assert run_k1["cell"] == "249-256" and run_k1["share_taking_prompts"] == pytest.approx(
        0.5, abs=0.01
    )
    assert run_k1["extra_ms_when_taking_prompts"] == pytest.approx(6.0, abs=0.01)
    fit: dict[str, Any] = run_k1["fit_ms_per_request"]
    assert fit["per_step_taking"] == pytest.approx(6.0, abs=0.05)
    assert fit["per_new_request"] == pytest.approx(0.0, abs=0.05)
    assert run_k1["fit_ms_per_token"]["per_100_prefill_tokens"] == pytest.approx(0.0, abs=0.1)
    assert groups[("decode-heavy-B256", "run", 0)]["pure_decode_ms"] == pytest.approx(16.0)
    (pair,) = out["burst_against_run"]
    # The bursts took prompts in less often than k=1's run: they read fast, the correction
    # puts the run's share of such steps back.
    assert pair["k"] == 1 and pair["burst_over_run"] < 0.9
    assert pair["corrected_over_run"] == pytest.approx(1.0, abs=0.01)


def test_a_switch_step_and_a_step_after_idle_are_not_timed() -> None:
    lines = [
        (0.0, 4, 1, 4, 8, 0, 0, 0),
        (0.02, 4, 1, 4, 8, 0, 0, 1),  # the scheduler emptied after it
        (9.0, 4, 1, 4, 8, 0, 0, 0),  # not timed: the gap held idle time
        (9.02, 4, 1, 4, 8, 0, 0, 0),
        (9.04, 4, 2, 8, 12, 0, 0, 0),  # a switch: not timed
        (9.06, 4, 2, 8, 12, 0, 0, 0),
        (9.08, 4, 0, 0, 224, 4, 0, 0),  # every request new: no k applies
    ]
    steps = list(report.timed_steps(lines))
    assert [(s.time_s, s.k) for s in steps] == [(0.02, 1), (9.02, 1), (9.06, 2)]
    assert all(s.seconds == pytest.approx(0.02) for s in steps)
