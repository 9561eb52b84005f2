"""The GPU jobs' traffic (bench/gpu/traffic.py): named shapes of request lengths, drawn within
their bounds and the engine's max_model_len; decode-heavy exactly as the live step-time job drew
its requests before its traffic became this module."""

from __future__ import annotations

import argparse
import random
import statistics
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.gpu_jobs import load_gpu_module

traffic = load_gpu_module("traffic")
SHAPES = list(traffic.SHAPES.values())
LAUNCH_MAX_MODEL_LEN = 4096  # bench/gpu/live_step_time.sh's --max-model-len


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
    requests = traffic.client_requests(
        seed, index, "m", traffic.DECODE_HEAVY, max_model_len=LAUNCH_MAX_MODEL_LEN
    )
    assert [next(requests) for _ in range(4)] == reference_client(seed, index, 4)


def test_decode_heavy_is_recorded_as_the_jobs_recorded_their_lengths() -> None:
    assert traffic.DECODE_HEAVY.describe() == {"prompt": (16, 96), "output": (300, 700)}


# -- every shape ----------------------------------------------------------------------------------

shapes = st.sampled_from(SHAPES)


@st.composite
def shape_and_max_model_len(draw: st.DrawFn) -> tuple[Any, int]:
    """A shape and an engine context from just enough for its shortest request to 8,192."""
    shape = draw(shapes)
    return shape, draw(st.integers(shape.prompt.low + shape.output.low, 8192))


@given(case=shape_and_max_model_len(), seed=st.integers(0, 2**32))
def test_a_draw_stays_within_the_shapes_bounds_and_the_engines_context(
    case: tuple[Any, int], seed: int
) -> None:
    shape, max_model_len = case
    prompt, output = traffic.draw_lengths(random.Random(seed), shape, max_model_len=max_model_len)
    assert shape.prompt.low <= prompt <= shape.prompt.high
    assert shape.output.low <= output <= shape.output.high
    assert prompt + output <= max_model_len


@given(case=shape_and_max_model_len(), seed=st.integers(0, 2**32))
def test_a_first_request_starts_part_way_through_a_whole_request(
    case: tuple[Any, int], seed: int
) -> None:
    shape, max_model_len = case
    whole = traffic.draw_lengths(random.Random(seed), shape, max_model_len=max_model_len)
    prompt, output = traffic.draw_lengths(
        random.Random(seed), shape, max_model_len=max_model_len, first=True
    )
    # The same draw, part of its output moved into the prompt: the context is a whole request's.
    assert prompt + output == sum(whole) and prompt >= whole[0] and 1 <= output <= whole[1]


@given(shape=shapes, seed=st.integers(0, 2**32), index=st.integers(0, 255))
def test_the_same_seed_sends_the_same_requests(shape: Any, seed: int, index: int) -> None:
    def sent() -> list[dict[str, Any]]:
        requests = traffic.client_requests(seed, index, "m", shape, max_model_len=8192)
        return [next(requests) for _ in range(3)]

    first, again = sent(), sent()
    assert first == again
    for body in first:
        assert body["ignore_eos"] is True and body["max_tokens"] >= 1


@given(shape=shapes, short=st.integers(1, 64))
def test_an_engine_too_small_for_the_shape_is_refused(shape: Any, short: int) -> None:
    max_model_len = shape.prompt.low + shape.output.low - short
    with pytest.raises(ValueError, match=f"{shape.name} needs max_model_len >= "):
        traffic.draw_lengths(random.Random(0), shape, max_model_len=max_model_len)


def test_a_driver_refuses_a_shape_its_engine_cannot_hold(capsys: pytest.CaptureFixture) -> None:
    parser = argparse.ArgumentParser()
    traffic.add_traffic_arguments(parser)
    assert traffic.checked_shape(parser, parser.parse_args([])) is traffic.DECODE_HEAVY
    args = parser.parse_args(["--shape", "long-context", "--max-model-len", "1024"])
    with pytest.raises(SystemExit):
        traffic.checked_shape(parser, args)
    assert "long-context needs max_model_len >= 2100 (got 1024)" in capsys.readouterr().err


def test_bounds_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError, match=r"bounds 10\.\.5"):
        traffic.TrafficShape("odd", prompt=traffic.Uniform(10, 5), output=traffic.Uniform(1, 2))


# -- the named shapes over 10,000 seeded draws ----------------------------------------------------


def draws(shape: Any, max_model_len: int = LAUNCH_MAX_MODEL_LEN) -> list[tuple[int, int]]:
    rng = random.Random(16)
    return [traffic.draw_lengths(rng, shape, max_model_len=max_model_len) for _ in range(10_000)]


def test_chat_like_prompts_are_around_600_tokens_and_outputs_around_250() -> None:
    prompts, outputs = zip(*draws(traffic.CHAT_LIKE), strict=True)
    assert statistics.median(prompts) == pytest.approx(600, rel=0.05)
    assert statistics.median(outputs) == pytest.approx(250, rel=0.05)
    # Spread, not a constant: a quarter of the prompts under ~400 tokens, a quarter over ~900.
    low, _, high = statistics.quantiles(prompts, n=4)
    assert low < 450 and high > 800


def test_long_context_prompts_are_2000_to_4000_tokens() -> None:
    prompts, outputs = zip(*draws(traffic.LONG_CONTEXT, max_model_len=8192), strict=True)
    assert min(prompts) >= 2000 and max(prompts) <= 4000
    assert min(prompts) < 2100 and max(prompts) > 3900  # the whole range, not a corner of it
    assert min(outputs) >= 100 and max(outputs) <= 300


def test_decode_heavy_prompts_are_short_and_outputs_long() -> None:
    prompts, outputs = zip(*draws(traffic.DECODE_HEAVY), strict=True)
    assert (min(prompts), max(prompts)) == (16, 96)
    assert (min(outputs), max(outputs)) == (300, 700)


def test_long_context_under_the_launchs_4096_loses_the_end_of_outputs_not_prompts() -> None:
    fitted = draws(traffic.LONG_CONTEXT)  # the same rng draws as under 8,192
    for (prompt, output), (free_prompt, free_output) in zip(
        fitted, draws(traffic.LONG_CONTEXT, 8192), strict=True
    ):
        assert prompt == min(free_prompt, LAUNCH_MAX_MODEL_LEN - 100)
        assert output == min(free_output, LAUNCH_MAX_MODEL_LEN - prompt)
    assert max(p + o for p, o in fitted) == LAUNCH_MAX_MODEL_LEN
