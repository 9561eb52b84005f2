"""bench/gpu/burst_vs_run.py: where a burst's cost may land (the steps at a new k)."""

from __future__ import annotations

from typing import Any

import pytest

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


def _pair(ratio: float, burst_tokens: float, arm_tokens: float, load: str = "decode-heavy-B256",
          arm_ms: float = 10.0) -> dict[str, Any]:  # fmt: skip
    return {"ratio": ratio, "burst_tokens_per_step": burst_tokens,
            "arm_tokens_per_step": arm_tokens, "load": load, "arm_ms": arm_ms,
            "burst_ms": ratio * arm_ms}  # fmt: skip


def test_pairs_are_grouped_by_the_tokens_a_burst_step_carries_beside_its_arms() -> None:
    # Same k and cell, so a difference in tokens a step is prompt tokens riding along.
    pairs = [
        _pair(0.8, 1060.0, 1090.0),  # 30 fewer: the run's prefill, not the k's
        _pair(0.9, 540.0, 556.0),
        _pair(1.0, 820.0, 825.0),  # within 10
        _pair(1.4, 296.0, 283.0),  # 13 more
    ]
    grouped = burst_vs_run.by_tokens_carried(pairs, margin=10.0)
    assert grouped["fewer"] == {"pairs": 2, "ratio_median": 0.85}
    assert grouped["alike"] == {"pairs": 1, "ratio_median": 1.0}
    assert grouped["more"] == {"pairs": 1, "ratio_median": 1.4}
    assert grouped["margin_tokens"] == 10.0
    assert 0.9 < grouped["pearson_r"] <= 1.0


def test_no_pairs_no_grouping() -> None:
    grouped = burst_vs_run.by_tokens_carried([], margin=10.0)
    assert grouped["fewer"] == {"pairs": 0, "ratio_median": None}
    assert grouped["pearson_r"] is None


def test_per_shape_a_token_more_a_step_is_priced_through_zero() -> None:
    # decode-heavy: 0.2 ms a token (3 ms over 15 tokens, 6 over 30); chat-like: 0.01.
    pairs = [
        _pair(0.7, 1070.0, 1085.0, arm_ms=10.0),
        _pair(0.8, 1060.0, 1090.0, "decode-heavy-B128", arm_ms=30.0),
        _pair(0.9, 1000.0, 1100.0, "chat-like-B192", arm_ms=10.0),
        _pair(0.95, 1000.0, 1050.0, "chat-like-B64", arm_ms=10.0),
    ]
    shapes = burst_vs_run.per_shape_slopes(pairs)
    assert shapes["decode-heavy"]["ms_per_token"] == pytest.approx(0.2)
    assert shapes["chat-like"]["ms_per_token"] == pytest.approx(0.01)
    assert shapes["chat-like"]["pairs"] == 2 and shapes["chat-like"]["pearson_r"] is None


def test_a_step_time_linear_in_prompt_tokens_is_corrected_exactly() -> None:
    # Pure decode 10 ms, 0.2 ms a prompt token: a burst carrying 20 took 14 ms, the run
    # carrying 50 took 20 ms.
    assert burst_vs_run.prompt_corrected(14.0, 10.0, 20.0, 50.0) == pytest.approx(20.0)
    # Under one prompt token a step, no proportion to scale by.
    assert burst_vs_run.prompt_corrected(14.0, 10.0, 0.5, 50.0) is None


def test_the_log_ratios_spread_adds_both_means_own_at_the_correlation() -> None:
    # Burst: 50 steps, mean 20 ms, sd 10 ms (a 0.5 share); arm: 200 steps, mean 10, sd 2 (0.2).
    def sums(steps: float, mean: float, sd: float) -> list[float]:
        return [steps, steps * mean, 0.0, steps * (sd * sd + mean * mean), 0.0]

    spread = burst_vs_run.log_ratio_sd(sums(50, 20.0, 10.0), sums(200, 10.0, 2.0), 2.0)
    assert spread == pytest.approx((0.25 * 2 / 50 + 0.04 * 2 / 200) ** 0.5)


def test_error_sources_set_the_bursts_error_beside_noise_and_the_prompt_correction() -> None:
    pairs = [
        {**_pair(1.2, 560.0, 556.0), "log_ratio_sd": 0.05, "ratio_prompt_corrected": 1.0},
        {**_pair(0.9, 540.0, 556.0), "log_ratio_sd": 0.1, "ratio_prompt_corrected": 0.9},
        {**_pair(1.0, 540.0, 556.0), "log_ratio_sd": 0.1, "ratio_prompt_corrected": None},
    ]
    sources = burst_vs_run.error_sources(pairs)
    assert sources["pairs"] == 3
    assert sources["share_past_two_sd"] == pytest.approx(1 / 3, abs=1e-3)  # only 1.2 at 0.05
    assert sources["prompt_corrected_pairs"] == 2
    assert sources["mean_abs_log_ratio_prompt_corrected"] == pytest.approx(0.0527, abs=1e-4)
    assert sources["mean_abs_log_ratio_of_those"] == pytest.approx(0.1438, abs=1e-4)
    assert burst_vs_run.error_sources([]) == {"pairs": 0}


def test_the_extra_spread_is_none_where_the_errors_are_their_own_noise() -> None:
    # Errors of exactly +-1 sd (0.1): nothing beyond; of +-0.5 on a 0.3 sd: 0.4 beyond.
    assert burst_vs_run.extra_spread([0.1, -0.1, 0.1, -0.1], [0.1] * 4) == 0.0
    assert burst_vs_run.extra_spread([0.5, -0.5], [0.3, 0.3]) == pytest.approx(0.4)
    assert burst_vs_run.extra_spread([], []) == 0.0
