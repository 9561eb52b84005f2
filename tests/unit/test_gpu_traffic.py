"""The GPU jobs' traffic (bench/gpu): requests drawn exactly as the live step-time job drew them
before its traffic became a module of named shapes."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.support.gpu_jobs import load_gpu_module

load_gpu_module("live_step_time_report")  # the driver imports it by name
driver = load_gpu_module("live_step_time")


def reference_body(rng: random.Random, model: str, *, first: bool) -> dict[str, Any]:
    """bench/gpu/live_step_time.py's request_body as it was (prompts 16-96 tokens, outputs
    300-700, a client's first request part-way through), copied verbatim as the reference."""
    prompt_len = rng.randint(16, 96)
    output = rng.randint(300, 700)
    if first:
        done = rng.randint(0, output - 1)
        prompt_len, output = prompt_len + done, output - done
    return {
        "model": model,
        "prompt": [rng.randrange(1000, 30000) for _ in range(prompt_len)],
        "max_tokens": output,
        "ignore_eos": True,
        "temperature": 0.0,
    }


def reference_client(seed: int, index: int, count: int) -> list[dict[str, Any]]:
    """The first ``count`` requests client ``index`` of ClosedLoop(seed=seed) sent."""
    rng = random.Random(seed * 100_003 + index)
    return [reference_body(rng, "m", first=n == 0) for n in range(count)]


@given(seed=st.integers(0, 2**16), index=st.integers(0, 255))
def test_decode_heavy_draws_what_the_live_step_time_job_drew(seed: int, index: int) -> None:
    rng = random.Random(seed * 100_003 + index)
    sent = [driver.request_body(rng, "m", driver.Lengths(), first=n == 0) for n in range(4)]
    assert sent == reference_client(seed, index, 4)
