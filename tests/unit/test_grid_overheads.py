"""bench/grid_overheads.py: the steps between windows it estimates from contexts (for raw files
without per-window engine steps) are the ones the windows recorded, on the step-level fake."""

from __future__ import annotations

import itertools

import pytest
from bench.grid_overheads import _uncounted_from_context, analyse

from tabletune.profiler.records import WindowSample
from tests.unit.profiler_stepper import SteppingEngine
from tests.unit.test_profiler_inflight import GRID, IN_FLIGHT, KS, measurer


def test_contexts_give_the_steps_between_windows_that_the_windows_recorded() -> None:
    engine = SteppingEngine(fresh=True)
    samples: list[WindowSample] = []
    m = measurer(engine, windows=samples)
    m.measure(GRID, KS)
    windows = [w.model_dump() for w in samples]
    uncounted = [w["engine_steps"] - w["steps"] for w in windows]
    expected = [
        (uncounted[i] + uncounted[i + 1]) / 2
        for i, (a, b) in enumerate(itertools.pairwise(windows))
        if a["batch_size"] == b["batch_size"] and b["context_tokens"] > a["context_tokens"]
    ]
    estimated = [steps for steps, _ in _uncounted_from_context(windows)]
    assert len(estimated) == len(expected) > len(windows) / 2
    assert estimated == pytest.approx(expected)

    older = [{k: v for k, v in w.items() if k != "engine_steps"} for w in windows]
    raw = {"windows": older, "metadata": {"wall_time_s": {"timing": 1.0}}}
    events = {"in_flight_events": dict(m.events)}
    between = analyse(raw, events, IN_FLIGHT.window_steps)["between_windows"]
    assert between["source"] == "estimated from contexts"
    assert between["steps_per_window"] == pytest.approx(sum(expected) / len(expected))
    recorded = analyse({**raw, "windows": windows}, events, IN_FLIGHT.window_steps)
    assert recorded["between_windows"]["steps_per_window"] == pytest.approx(
        sum(uncounted) / len(uncounted)
    )
