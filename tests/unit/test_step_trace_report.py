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
DRAFTING_S = {0: 0.016, 1: 0.026}  # a step's time by the drafts it makes (the H200's way)
TAKING_S = 0.006  # once per step that takes prompts in, however many


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def _trace(
    plan: list[tuple[int, int]], drafting: dict[int, float] = DRAFTING_S
) -> tuple[str, list[float]]:
    """The trace of back-to-back steps at batch 250, one per (lookup's k, new requests) in
    ``plan``: a step drafts the lookup's k, verifies the step before's, and takes as long as
    its drafts (and prompts) say; each new request brings a 56-token prompt. Returns the text
    and each step's time."""
    lines = [HEADER]
    t, verified = START, 0
    lines.append(trace_line(t, {"a": 1}, 1, {}, new_requests=0, finished_requests=0,
                            idle_after=False, drafts_next=plan[0][0]))  # fmt: skip
    times = []
    for drafted, new in plan:
        t += drafting[drafted] + (TAKING_S if new else 0.0)
        decodes = {f"r{i}": 1 + verified for i in range(250 - new)}
        prompts = {f"p{i}": 56 for i in range(new)}
        spec = {r: [0] * verified for r in decodes} if verified else {}
        scheduled = decodes | prompts
        lines.append(trace_line(t, scheduled, sum(scheduled.values()), spec, new_requests=new,
                                finished_requests=0, idle_after=False,
                                drafts_next=drafted))  # fmt: skip
        times.append(t)
        verified = drafted
    return "".join(lines), times


def test_bursts_read_as_their_runs_when_counted_by_the_drafts_made() -> None:
    # A run of k=1 (a fixed arm): prompts come in every other step. Then a daemon window of
    # k=0's run with bursts of k=1 (the lookup says 1 for 4 steps of 32) taking prompts in one
    # step of 8.
    run = [(1, 1 + (i % 3 == 0)) if i % 2 else (1, 0) for i in range(400)]
    daemon = [(1 if i % 32 < 4 else 0, 1 if i % 8 == 2 else 0) for i in range(60 * 32)]
    text, times = _trace(run + daemon)
    boundary = times[len(run) - 1] + 1e-4
    raw = {"meta": {}, "windows": [
        {"part": "decode-heavy-B256-arms", "arm": "k1",
         "started_utc": _utc(START), "ended_utc": _utc(boundary)},
        {"part": "decode-heavy-B256-daemon", "arm": "live",
         "started_utc": _utc(boundary), "ended_utc": _utc(times[-1] + 1)},
    ]}  # fmt: skip
    out = report.report(raw, text)
    rules = out["rules"]
    groups = {(g["load"], g["kind"], g["k"]): g for g in rules["drafts"]["groups"]}
    run_k1 = groups[("decode-heavy-B256", "run", 1)]
    assert run_k1["cell"] == "249-256"
    assert run_k1["share_taking_prompts"] == pytest.approx(0.5, abs=0.01)
    assert run_k1["extra_ms_when_taking_prompts"] == pytest.approx(6.0, abs=0.01)
    fit: dict[str, Any] = run_k1["fit_ms_per_request"]
    assert fit["per_step_taking"] == pytest.approx(6.0, abs=0.05)
    assert fit["per_new_request"] == pytest.approx(0.0, abs=0.05)
    assert run_k1["fit_ms_per_token"]["per_100_prefill_tokens"] == pytest.approx(0.0, abs=0.1)
    assert groups[("decode-heavy-B256", "run", 0)]["pure_decode_ms"] == pytest.approx(16.0)
    (pair,) = rules["drafts"]["burst_against_run"]
    # Counted by the drafts made, the bursts' steps are a run's steps: what is left is that
    # they took prompts in less often, which the correction puts back.
    assert pair["k"] == 1 and pair["burst_pure_ms"] == pytest.approx(26.0)
    assert pair["corrected_over_run"] == pytest.approx(1.0, abs=0.01)
    # Counted by the k verified, the burst's last step (drafting 0, 16 ms) reads in k=1's
    # cell and the step before it (drafting 1, 26 ms) in k=0's.
    (before,) = rules["verified"]["burst_against_run"]
    assert before["burst_pure_ms"] < 23.0 and before["corrected_over_run"] < 0.95
    verified_groups = {(g["kind"], g["k"]): g for g in rules["verified"]["groups"]}
    assert verified_groups[("run", 0)]["pure_decode_ms"] > 16.2
    table = {(r["verified"], r["drafted"]): r["median_ms"] for r in out["by_verified_and_drafted"]}
    assert table[(0, 1)] == pytest.approx(26.0) and table[(1, 0)] == pytest.approx(16.0)


def test_a_switch_step_and_a_step_after_idle_are_not_timed() -> None:
    lines = [
        (0.0, 4, 1, 4, 8, 0, 0, 0),
        (0.02, 4, 1, 4, 8, 0, 0, 1),  # the scheduler emptied after it
        (9.0, 4, 1, 4, 8, 0, 0, 0),  # not timed: the gap held idle time
        (9.02, 4, 1, 4, 8, 0, 0, 0),  # timed, though the next verifies 2: it drafted 2
        (9.04, 4, 2, 8, 12, 0, 0, 0),
        (9.06, 4, 2, 8, 12, 0, 0, 0),
        (9.08, 4, 0, 0, 224, 4, 0, 0),  # every request new: no k applies
    ]
    # A trace from before the drafts column: the drafts made are the next line's k.
    steps = list(report.timed_steps(lines))
    assert [(s.time_s, s.k) for s in steps] == [(0.02, 1), (9.04, 2)]
    assert all(s.seconds == pytest.approx(0.02) for s in steps)
    # The plugin's rule before: the first step verifying another k was the switch.
    verified = list(report.timed_steps(lines, rule="verified"))
    assert [(s.time_s, s.k) for s in verified] == [(0.02, 1), (9.02, 1), (9.06, 2)]
    with_column = [
        (*line, drafted) for line, drafted in zip(lines, (1, 1, 1, 1, 2, 0, 0), strict=True)
    ]
    assert [s.time_s for s in report.timed_steps(with_column)] == [0.02, 9.02, 9.04]
    with pytest.raises(ValueError, match="rule"):
        list(report.timed_steps(lines, rule="lookup"))


def test_exploring_costs_every_step_switch_steps_included() -> None:
    # k=0's table at B=250 (16 ms a step); a burst every 32 steps: the lookup says 1 for 4
    # steps (a step drafting 1 takes 30 ms). Per 32 steps: 27 steps of the table's k, one
    # drafting 1 while verifying 0, three of k=1 through and through, one verifying 1 while
    # drafting 0: 568 ms for 27 + 1 + 4 x 1.75 tokens a request, against 1 per 16 ms.
    plan = [(1 if i % 32 < 4 else 0, 0) for i in range(40 * 32)]
    text, times = _trace(plan, {0: 0.016, 1: 0.030})
    per_window = 32 * 5  # five bursts a window
    windows = [
        {"part": "decode-heavy-B256-daemon", "arm": "live", "mean_running": 250.0,
         "since_daemon_start_s": float(w),
         "view": {"table": [[1, 256, 0]]},
         "started_utc": _utc(times[w * per_window] - 1e-4 if w else START - 1),
         "ended_utc": _utc(times[(w + 1) * per_window - 1] + 1e-4)}
        for w in range(len(plan) // per_window)
    ]  # fmt: skip
    raw = {"meta": {"synthetic_rates": [0.75, 0.55, 0.40]}, "windows": windows}
    (cost,) = report.exploring_cost(raw, report.read_trace(text))
    assert cost["table_k"] == 0 and cost["batch"] == 250
    expected = 1 - (250 * (27 + 1 + 4 * 1.75) / 0.568) / (250 / 0.016)
    # the first window after the table settled is left out (it may hold the old table's steps)
    assert cost["windows"] == len(windows) - 1
    assert cost["loss_against_the_table_k_steps"] == pytest.approx(expected, abs=2e-3)
    low, high = cost["bootstrap_95"]
    assert low <= cost["loss_against_the_table_k_steps"] <= high
    kinds = cost["kinds"]
    assert kinds["switch 0->1"]["goodput_over_table_k"] == pytest.approx(16 / 30, abs=1e-3)
    assert kinds["steady k=1"]["steps"] == 3 * kinds["switch 0->1"]["steps"]
