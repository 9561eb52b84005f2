"""``tabletune profile`` with in-flight timing (the default) end to end: the fake engine's admin
API, counters and acceptance over HTTP, its step cells from a step-level fake in virtual time
(tests/unit/profiler_stepper.py), every file written with the new metadata."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tabletune.admin.protocol import StepCellsRead
from tabletune.profiler.engine import EngineHttp
from tabletune.profiler.errors import MeasurementError
from tabletune.profiler.inflight import PHASES
from tabletune.profiler.progress import QuietReporter
from tabletune.profiler.records import RawRecord
from tabletune.profiler.run import ProfileRequest, ProfileRun
from tabletune.profiler.settings import (
    AcceptanceSettings,
    ConnectionSettings,
    GridSettings,
    InFlightSettings,
    ProfilerSettings,
    TimingSettings,
)
from tabletune.schemas import load_profile
from tests.unit.profiler_stepper import SteppingEngine, linear_ms, metrics_text
from tests.unit.test_profiler_fake_engine import FakeConfig, FakeEngine

MAX = 32
SETTINGS = ProfilerSettings(
    grid=GridSettings(dense_until=4, step=8),  # 1,2,3,4,12,20,28,32
    timing=TimingSettings(warmup_batches=(1,), repeats=3, decode_tokens=16),
    in_flight=InFlightSettings(window_timeout_s=5.0, cross_check=(2, 20)),
    acceptance=AcceptanceSettings(
        num_prompts=40, max_tokens=65, concurrency=16, synthetic_rates=(0.75, 0.55, 0.40)
    ),
    connection=ConnectionSettings(request_timeout_s=5.0),
)
GRID = (1, 2, 3, 4, 12, 20, 28, 32)
NO_ACCEPTANCE = replace(SETTINGS.acceptance, enabled=False)


def profile_in_flight(
    tmp_path: Path,
    settings: ProfilerSettings = SETTINGS,
    engine_log: Path | None = None,
    fail_with: str | None = None,
    *,
    route: bool = False,
    route_reads: list[float] | None = None,
) -> ProfileRun:
    """With ``route``, the fake's admin API serves the stepper's cells as of its last step
    (its engine steps when each read comes, in ``route_reads``); else /metrics, synced."""
    fake = FakeEngine(
        FakeConfig(step_ms=linear_ms, prefill_ms=0.0, overhead_ms=0.0, max_num_seqs=MAX)
    )
    stepper = SteppingEngine(k_at=fake.k_at, fail_with=fail_with)
    fake.extra_metrics = lambda: metrics_text(stepper.step_reading())
    if route:
        assert fake.backend is not None

        def cells() -> StepCellsRead:
            now = stepper.live_reading()
            (route_reads if route_reads is not None else []).append(now.engine_steps)
            return StepCellsRead(dict(now.cells), now.steps_without_decode, 0.0, now.switch_steps)

        fake.backend.step_cells = cells
    request = ProfileRequest(
        output=tmp_path / "inflight.json",
        model="/models/fake",
        drafter="/models/fake-eagle3",
        num_speculative_tokens=3,
        max_num_seqs=MAX,
        gpu="FAKE GPU",
        model_runner="v2",
        engine_log=engine_log,
    )
    with fake.serve() as url:
        run = ProfileRun(
            replace(request, attach_url=url),
            settings=settings,
            reporter=QuietReporter(),
            engine_factory=lambda u: EngineHttp(
                u, settings=settings.connection, clock=fake.clock.now
            ),
            traffic_factory=lambda engine: stepper,
            clock=fake.clock.now,
            wait=(stepper.clock, stepper.sleep),
        )
        run.run()
    return run


def test_in_flight_profile_writes_exact_times_shape_graphs_and_agreement(tmp_path: Path) -> None:
    run = profile_in_flight(tmp_path)
    profile = load_profile(run.paths.profile)
    meta = profile.metadata
    assert meta.timing_method == "in-flight"
    assert profile.batch_grid == GRID and profile.ks == (0, 1, 2, 3)
    for cell in profile.cells:
        assert cell.step_ms == pytest.approx(linear_ms(cell.batch_size, cell.k), rel=1e-9)
        assert cell.tokens_per_step == cell.batch_size * (1 + cell.k)
        assert cell.context_tokens is not None and 32 < cell.context_tokens <= 256
    shape = meta.timing_shape
    assert shape is not None and shape.prompt_tokens == 32 and shape.extra_tokens_per_step == 0
    assert shape.prefill_stream is None
    # attached: the capture sizes are vLLM 0.26's rule for max_num_seqs 32, K=3 (limit 256)
    assert meta.cuda_graphs is not None and meta.cuda_graphs.max_capture_size == 256
    graphs = {(c.batch_size, c.k): c for c in profile.cells}
    assert graphs[(3, 0)].cuda_graph == "eager" and "3-token bucket" in graphs[(3, 0)].note
    assert graphs[(4, 2)].cuda_graph == "piecewise"
    assert graphs[(32, 3)].cuda_graph == "full" and graphs[(32, 3)].note == ""
    assert "cells without a full CUDA graph" in meta.notes and "B=3 k=0 eager" in meta.notes
    assert {"timing", "cross_check", "acceptance", "total"} <= set(meta.wall_time_s)
    summary = json.loads(run.paths.summary.read_text())
    check = summary["cross_check"]
    assert len(check["cells"]) == 2 * 4 and check["agree"] is True
    assert check["median_difference"] == pytest.approx(0.0, abs=1e-6)  # both exact here
    assert summary["timing_method"] == "in-flight" and summary["windows_taken_again"] == 0
    assert summary["cuda_graphs"]["not_full"]["3,0"] == "eager"
    # where the timing's wall time went, and how often the costly things happened
    phases = {f"timing.{name}" for name in PHASES}
    assert phases <= set(meta.wall_time_s) == set(summary["wall_time_s"])
    assert summary["in_flight_events"]["windows"] == len(GRID) * 4 * 3
    assert summary["in_flight_events"]["route_reads"] == 0  # this fake has no route: /metrics
    raw = RawRecord.model_validate_json(run.paths.raw.read_text())
    assert raw.timing_method == "in-flight" and len(raw.windows) == len(GRID) * 4 * 3
    assert len(raw.cross_check_samples) == 2 * 4 * 3 and raw.samples == []
    assert profile.acceptance is not None
    assert "bundled chat prompts" in profile.acceptance.prompt_source


def test_through_the_step_cells_route_the_profile_is_as_exact(tmp_path: Path) -> None:
    reads: list[float] = []
    run = profile_in_flight(
        tmp_path, replace(SETTINGS, acceptance=NO_ACCEPTANCE), route=True, route_reads=reads
    )
    profile = load_profile(run.paths.profile)
    for cell in profile.cells:
        assert cell.step_ms == pytest.approx(linear_ms(cell.batch_size, cell.k), rel=1e-9)
    raw = RawRecord.model_validate_json(run.paths.raw.read_text())
    windows = raw.windows
    assert len(windows) == len(GRID) * 4 * 3
    assert all(w.steps == SETTINGS.in_flight.window_steps for w in windows)  # ended on time
    summary = json.loads(run.paths.summary.read_text())
    events = summary["in_flight_events"]
    assert len(reads) == events["reads"] == events["route_reads"]  # every one through the route


def test_a_failed_timing_still_shows_where_its_time_went(tmp_path: Path) -> None:
    with pytest.raises(MeasurementError, match="a timed request failed"):
        profile_in_flight(tmp_path, fail_with="1 requests: HTTP 500")
    raw = RawRecord.model_validate_json((tmp_path / "inflight.raw.json").read_text())
    assert raw.incomplete
    assert {f"timing.{name}" for name in PHASES} <= set(raw.metadata.wall_time_s)


def test_a_prefill_stream_is_recorded_as_the_profiles_shape(tmp_path: Path) -> None:
    from tabletune.schemas.shape import PrefillStream

    stream = PrefillStream(requests_per_s=50, prompt_tokens=(64, 128))
    settings = replace(
        SETTINGS,
        grid=GridSettings(explicit=(4, 8)),
        in_flight=replace(SETTINGS.in_flight, prefill_stream=stream, cross_check=()),
    )
    log = tmp_path / "vllm.log"
    log.write_text(
        "... compilation_config={'cudagraph_capture_sizes': [1, 2, 4, 8, 16, 24], "
        "'max_cudagraph_capture_size': 24} ...\n"
    )
    profile = load_profile(profile_in_flight(tmp_path, settings, engine_log=log).paths.profile)
    graphs = profile.metadata.cuda_graphs
    assert graphs is not None and graphs.source == "engine log" and graphs.max_capture_size == 24
    assert {(c.batch_size, c.k) for c in profile.cells if c.cuda_graph == "eager"} >= {(8, 3)}
    shape = profile.metadata.timing_shape
    assert shape is not None and shape.prefill_stream == stream
    assert shape.extra_tokens_per_step > 0
    assert all(
        c.tokens_per_step and c.tokens_per_step > c.batch_size * (1 + c.k) for c in profile.cells
    )
