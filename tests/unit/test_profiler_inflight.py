"""The in-flight measurer against a step-level fake engine in virtual time
(tests/unit/profiler_stepper.py): exact step times, k interleaved, contexts capped, broken
windows taken again, outliers re-measured, a prefill stream riding along, clear failures."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from tabletune.profiler.errors import MeasurementError
from tabletune.profiler.inflight import PHASES, READING, InFlightMeasurer
from tabletune.profiler.inflight_plan import (
    Group,
    Holding,
    k_orders,
    next_action,
    output_tokens,
)
from tabletune.profiler.progress import QuietReporter
from tabletune.profiler.records import WindowSample
from tabletune.profiler.settings import InFlightSettings, TimingSettings
from tabletune.profiler.step_reading import StepReading
from tabletune.schemas.shape import PrefillStream
from tests.unit.profiler_stepper import SteppingEngine, linear_ms

TIMING = TimingSettings(repeats=3, warmup_batches=(1,))
IN_FLIGHT = InFlightSettings(window_timeout_s=5.0)
GRID = (1, 2, 3, 8, 20, 24)
KS = (0, 1, 2, 3)


def measurer(
    engine: SteppingEngine,
    *,
    timing: TimingSettings = TIMING,
    in_flight: InFlightSettings = IN_FLIGHT,
    windows: list[WindowSample] | None = None,
) -> InFlightMeasurer:
    return InFlightMeasurer(
        engine,
        engine,
        settings=timing,
        in_flight=in_flight,
        max_num_seqs=64,
        reporter=QuietReporter(),
        on_window=(windows if windows is not None else []).append,
        clock=engine.clock,
        sleep=engine.sleep,
    )


def test_k_orders_rotate_so_every_k_takes_every_place() -> None:
    assert k_orders([0, 1, 2, 3], 3) == [(0, 1, 2, 3), (1, 2, 3, 0), (2, 3, 0, 1)]
    assert k_orders([2], 2) == [(2,), (2,)]


def test_the_holding_adds_going_up_and_starts_over_when_contexts_would_pass_the_cap() -> None:
    held = Holding((Group(4, 32, sent_at_step=100),))
    assert next_action(Holding(), 4, 0, coming_steps=32, max_context=256) == "fresh"
    assert next_action(held, 4, 150, coming_steps=32, max_context=256) == "keep"
    assert next_action(held, 6, 150, coming_steps=32, max_context=256) == "add"
    assert next_action(held, 3, 150, coming_steps=32, max_context=256) == "fresh"
    assert next_action(held, 4, 100 + 256 - 32 - 32 + 1, coming_steps=32, max_context=256) == (
        "fresh"
    )
    two = held.with_group(Group(2, 32, sent_at_step=190))
    assert two.running == 6
    assert two.mean_context(200) == pytest.approx((4 * 132 + 2 * 42) / 6)
    assert two.oldest_context(200) == 132
    assert output_tokens(32, 256) == 224 + 64


def test_step_times_are_exact_windows_pure_and_k_interleaved() -> None:
    engine = SteppingEngine()
    windows: list[WindowSample] = []
    result = measurer(engine, windows=windows).measure(GRID, KS)
    assert set(result.samples) == {(b, k) for b in GRID for k in KS}
    for (b, k), samples in result.samples.items():
        assert len(samples) == 3
        assert samples == pytest.approx([linear_ms(b, k)] * 3, rel=1e-9)
    assert not result.noisy and not result.remeasured and not result.refused
    for w in windows:
        assert w.steps >= IN_FLIGHT.window_steps
        assert w.requests == w.steps * w.batch_size
        assert w.tokens == w.steps * w.batch_size * (1 + w.k)
        assert w.context_tokens <= IN_FLIGHT.max_context
    # every k is set once per repeat, in the rotated order, at each batch size after warm-up
    timed = engine.puts[len(KS) :]
    assert timed[:12] == [0, 1, 2, 3, 1, 2, 3, 0, 2, 3, 0, 1]
    details = result.details[(8, 2)]
    assert details.tokens_per_step == 8 * 3
    assert details.context_tokens is not None and 32 < details.context_tokens < 256


def test_going_up_adds_requests_and_contexts_stay_under_the_cap() -> None:
    engine = SteppingEngine()
    m = measurer(engine, in_flight=replace(IN_FLIGHT, max_context=128))
    m.measure((1, 2, 3, 4), (0, 1))
    sizes = [n for n, _, _ in engine.sent]
    assert (2, 1) in itertools.pairwise(sizes)  # from 2 to 3: one request added, not 3 sent
    assert m.fresh_starts >= 2  # contexts capped at 128: requests were replaced
    assert all(max_tokens == 128 - 32 + 64 for _, _, max_tokens in engine.sent)


def test_the_wall_time_is_split_by_phase_and_the_costly_events_counted() -> None:
    engine = SteppingEngine()
    put = engine.set_k_everywhere

    def slow_put(k: int, max_num_seqs: int) -> None:  # a round trip of 10 ms; steps go on
        engine.sleep(0.01)
        put(k, max_num_seqs)

    engine.set_k_everywhere = slow_put  # type: ignore[method-assign]
    read = engine.step_reading

    def slow_read() -> StepReading:  # a /metrics read of 2 ms
        engine.sleep(0.002)
        return read()

    engine.step_reading = slow_read  # type: ignore[method-assign]
    windows: list[WindowSample] = []
    m = measurer(engine, in_flight=replace(IN_FLIGHT, max_context=128), windows=windows)
    started = engine.clock()
    result = m.measure((1, 2, 3, 4), (0, 1))
    elapsed = engine.clock() - started
    assert set(m.phases_s) == {*PHASES, READING}
    assert m.phases_s["k_switch"] == pytest.approx(0.01 * len(engine.puts))
    assert m.phases_s[READING] == pytest.approx(0.002 * result.events["reads"])
    assert result.events["k_switches"] == len(engine.puts)
    assert sum(w.seconds for w in windows) <= m.phases_s["fill"]  # a window's steps run there
    assert m.phases_s["stop"] > 0 and m.phases_s["settle"] > 0
    assert sum(m.phases_s[p] for p in PHASES) <= elapsed + 1e-9  # none counted twice
    assert result.events["windows"] == len(windows) == 4 * 2 * 3
    assert result.events["fresh_starts"] == m.fresh_starts >= 2
    assert result.events["fresh_starts"] + result.events["adds"] == len(engine.sent)


def test_starting_over_often_keeps_the_idle_wait_at_a_few_syncs() -> None:
    """The gap across an idle engine is no sync interval: it must not stretch the next wait."""
    engine = SteppingEngine(sync_s=0.05)
    m = measurer(engine, in_flight=replace(IN_FLIGHT, max_context=32 + 2 * 16))
    m.measure((1, 2), (0, 1))
    assert m.fresh_starts >= 10  # before nearly every window
    assert m.sync_interval_s == pytest.approx(0.05, abs=0.021)  # a sync, give or take a poll


def test_a_request_that_ends_inside_a_window_has_the_window_taken_again() -> None:
    ended = {"done": False}

    def drop_one(engine: SteppingEngine) -> None:
        at_8_2 = sum(1 for step in engine.scheduled if step[:2] == (8, 2))
        if not ended["done"] and at_8_2 == 25:  # inside the second window of (8, 2)
            engine.running.pop()
            ended["done"] = True

    engine = SteppingEngine(on_step=drop_one)
    result = measurer(engine).measure((8,), KS)
    assert ended["done"]
    assert len(result.refused) == 1 and "B=8" in result.refused[0]
    assert result.samples[(8, 2)] == pytest.approx([linear_ms(8, 2)] * 3, rel=1e-9)


def test_a_lone_disturbance_is_re_measured_and_a_real_jump_is_flagged_noisy() -> None:
    disturbed = {"steps": 0}

    def step_ms(b: int, k: int) -> float:
        if (b, k) == (3, 1) and disturbed["steps"] < IN_FLIGHT.window_steps:  # first window only
            disturbed["steps"] += 1
            return 4 * linear_ms(b, k)
        if (b, k) == (20, 2):
            return 5 * linear_ms(b, k)  # always: no graph for that token count, say
        return linear_ms(b, k)

    engine = SteppingEngine(step_ms=step_ms)
    result = measurer(engine, timing=replace(TIMING, repeats=1)).measure(GRID, KS)
    assert set(result.remeasured) == {(3, 1), (20, 2)}
    assert result.noisy == {(20, 2)}
    assert result.samples[(3, 1)] == pytest.approx([linear_ms(3, 1)], rel=1e-9)  # replaced
    assert len(result.samples[(20, 2)]) == 2  # every round kept


def test_jittered_steps_give_medians_near_the_truth() -> None:
    engine = SteppingEngine(jitter=0.2)
    result = measurer(engine).measure((4, 16), (0, 3))
    for (b, k), samples in result.samples.items():
        assert sorted(samples)[1] == pytest.approx(linear_ms(b, k), rel=0.06)


def test_under_a_prefill_stream_windows_carry_prefill_and_cost_more() -> None:
    engine = SteppingEngine(prefill_ms_per_token=0.02)
    stream = PrefillStream(requests_per_s=40, prompt_tokens=(100, 300))
    windows: list[WindowSample] = []
    in_flight = replace(IN_FLIGHT, prefill_stream=stream, window_steps=64)
    result = measurer(engine, in_flight=in_flight, windows=windows).measure((8, 16), (1,))
    extra = [w.tokens / w.steps - w.batch_size * 2 for w in windows]
    assert sum(extra) > 0 and min(extra) >= 0
    assert any(w.requests > w.steps * w.batch_size for w in windows)
    details = result.details[(8, 1)]
    assert details.tokens_per_step is not None and details.tokens_per_step > 16
    assert max(result.samples[(8, 1)]) > linear_ms(8, 1)


def test_an_engine_that_does_not_step_is_a_clear_error() -> None:
    engine = SteppingEngine()
    engine.send = lambda prompts, *, max_tokens: None  # type: ignore[method-assign]
    with pytest.raises(MeasurementError, match="B=1: the requests sent did not settle into 1 "):
        measurer(engine).measure((2,), (0,))  # (the warm-up at B=1 is the first to wait)


def test_a_failed_request_stops_the_run_with_its_error() -> None:
    engine = SteppingEngine(fail_with="2 requests: HTTP 400: prompt too long")
    with pytest.raises(MeasurementError, match="a timed request failed: 2 requests: HTTP 400"):
        measurer(engine).measure((2,), (0,))
    assert engine.aborts >= 1  # whatever was running was stopped
