"""``tabletune profile`` end to end: engine, timing, acceptance, files. The server is always
stopped; whatever was measured is written even when the run fails or is interrupted."""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from tabletune import __version__
from tabletune.errors import InputError
from tabletune.profiler.acceptance import measure_acceptance
from tabletune.profiler.annotate import with_cuda_graphs
from tabletune.profiler.cross_check import Agreement, agreement, time_by_request
from tabletune.profiler.cudagraphs import (
    CaptureConfig,
    capture_config_from_args,
    capture_config_from_log,
)
from tabletune.profiler.engine import EngineHttp
from tabletune.profiler.hook_protocol import SamplerMode
from tabletune.profiler.inflight import InFlightMeasurer, shape_of_windows
from tabletune.profiler.measure import TimingMeasurer, TimingResult, check_all_rejected
from tabletune.profiler.progress import Reporter
from tabletune.profiler.prompts import (
    BUNDLED_PROMPTS,
    Prompt,
    TokenPrompts,
    bundled_prompts,
    load_prompt_set,
)
from tabletune.profiler.records import RawRecord, RawSample, WindowSample
from tabletune.profiler.server import SYNC_ENV, EngineSpec, starting_table
from tabletune.profiler.session import EngineFactory, EngineSession
from tabletune.profiler.settings import ProfilerSettings
from tabletune.profiler.timing import CellDetails, batch_grid, build_cells, explicit_grid
from tabletune.profiler.traffic import BackgroundTraffic, Traffic
from tabletune.schemas import AcceptanceProfile, Profile, ProfileMetadata, Table, save_model
from tabletune.schemas.profile import step_times_of
from tabletune.schemas.shape import TimingShape
from tabletune.solver import Solution, build_table

log = logging.getLogger("tabletune.profiler")


@dataclass(frozen=True)
class ProfileRequest:
    """What to profile and where the files go."""

    output: Path
    """the profile JSON; siblings share its stem (.acceptance.json, .table.json, .raw.json, PNGs)"""
    model: str
    num_speculative_tokens: int
    max_num_seqs: int
    drafter: str | None = None
    method: str = "eagle3"
    attach_url: str | None = None
    ks: tuple[int, ...] | None = None
    """profiled draft lengths; default 0..K"""
    gpu: str | None = None
    model_runner: Literal["v1", "v2"] | None = None
    plots: bool = True
    notes: str = ""
    engine_log: Path | None = None
    """attach mode: the server's log, read for its CUDA-graph capture sizes (launch mode reads
    the log of the server it starts)"""

    @property
    def profiled_ks(self) -> tuple[int, ...]:
        return self.ks if self.ks is not None else tuple(range(self.num_speculative_tokens + 1))


@dataclass(frozen=True)
class OutputPaths:
    profile: Path
    acceptance: Path
    table: Path
    raw: Path
    summary: Path
    heatmap: Path
    goodput: Path
    chosen_k: Path
    logs: Path

    @classmethod
    def beside(cls, profile: Path) -> OutputPaths:
        stem = profile.with_suffix("")

        def sibling(suffix: str) -> Path:
            return stem.with_name(stem.name + suffix)

        return cls(
            profile=profile,
            acceptance=sibling(".acceptance.json"),
            table=sibling(".table.json"),
            raw=sibling(".raw.json"),
            summary=sibling(".summary.json"),
            heatmap=sibling(".heatmap.png"),
            goodput=sibling(".goodput.png"),
            chosen_k=sibling(".chosen-k.png"),
            logs=sibling(".logs"),
        )


@dataclass
class ProfileOutcome:
    profile: Profile
    acceptance: AcceptanceProfile | None
    solution: Solution | None
    paths: OutputPaths
    wall_time_s: dict[str, float]
    notes: list[str] = field(default_factory=list)
    agreement: Agreement | None = None
    """in-flight vs the request method on the cross-check cells (when asked for)"""


def detect_gpu() -> str:
    """The local GPU's name (the profiler runs beside the server it launches)."""
    if shutil.which("nvidia-smi") is None:
        return "unknown"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.strip().splitlines()[0] if out.strip() else "unknown"


def _acceptance_mode(settings: ProfilerSettings) -> SamplerMode:
    rates = settings.acceptance.synthetic_rates
    return SamplerMode("synthetic", tuple(rates)) if rates else SamplerMode("standard")


def _acceptance_prompts(settings: ProfilerSettings, engine: EngineHttp) -> tuple[list[Prompt], str]:
    """The prompt file given; else the bundled chat prompts when the server tokenizes text;
    else synthetic token ids (a server started with --skip-tokenizer-init)."""
    acc = settings.acceptance
    if acc.prompts_path:
        return load_prompt_set(acc.prompts_path, limit=acc.num_prompts), acc.prompts_path
    if engine.accepts_text():
        prompts = bundled_prompts(limit=acc.num_prompts)
        return prompts, f"bundled chat prompts ({BUNDLED_PROMPTS}, {len(prompts)}, text)"
    timing = settings.timing
    generator = TokenPrompts.for_timing(timing, seed_offset=1)
    source = (
        f"synthetic token ids ({acc.num_prompts} x {timing.prompt_tokens}, seed {timing.seed + 1};"
        " the server has no tokenizer)"
    )
    return list(generator.take(acc.num_prompts)), source


TrafficFactory = Callable[[EngineHttp], Traffic]


class ProfileRun:
    """One ``tabletune profile`` run."""

    def __init__(
        self,
        request: ProfileRequest,
        *,
        settings: ProfilerSettings,
        reporter: Reporter,
        engine_factory: EngineFactory | None = None,
        traffic_factory: TrafficFactory | None = None,
        clock: Callable[[], float] = time.monotonic,
        wait: tuple[Callable[[], float], Callable[[float], None]] = (time.monotonic, time.sleep),
        gpu_name: Callable[[], str] = detect_gpu,
    ) -> None:
        """``clock`` times the phases; ``wait`` is the (clock, sleep) the in-flight method polls
        with (tests give a fake engine's virtual time)."""
        self.request = request
        self.settings = settings
        self.reporter = reporter
        self.paths = OutputPaths.beside(request.output)
        self._factory = engine_factory
        self._traffic_factory = traffic_factory or self._background_traffic
        self._clock = clock
        self._wait = wait
        self._gpu_name = gpu_name
        self.grid = (
            explicit_grid(settings.grid.explicit, request.max_num_seqs)
            if settings.grid.explicit
            else batch_grid(
                request.max_num_seqs,
                dense_until=settings.grid.dense_until,
                step=settings.grid.step,
            )
        )
        self.wall: dict[str, float] = {}
        self.samples: list[RawSample] = []
        self.windows: list[WindowSample] = []
        self.cross_samples: list[RawSample] = []
        self.refused: list[str] = []
        self.engine_version = "unknown"
        self.tensor_parallel_size: int | None = None
        self.allowed_k: tuple[int, ...] = ()
        self.agreement: Agreement | None = None
        self.log_text: Callable[[], str] = lambda: ""

    @property
    def in_flight(self) -> bool:
        return self.settings.timing.method == "in-flight"

    def _background_traffic(self, engine: EngineHttp) -> Traffic:
        timing = self.settings.timing
        return BackgroundTraffic(
            engine.base_url,
            model=engine.model(),
            temperature=self.settings.acceptance.temperature,
            timeout_s=self.settings.connection.request_timeout_s,
            token_low=timing.token_id_low,
            token_high=timing.token_id_high,
            seed=timing.seed + 7,
        )

    # -- metadata and files ------------------------------------------------------------------
    def _metadata(self, *, incomplete: bool, notes: list[str]) -> ProfileMetadata:
        r = self.request
        runner = r.model_runner or (
            "v2" if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "1") == "1" else "v1"
        )
        timing = self.settings.timing
        grid = self.settings.grid
        shape = (
            "explicit grid"
            if grid.explicit
            else f"grid dense to {grid.dense_until} then step {grid.step}"
        )
        if self.in_flight:
            w = self.settings.in_flight
            how = (
                f"in-flight, {timing.repeats} windows of {w.window_steps} steps (or "
                f"{w.window_max_s}s) per cell, k interleaved, contexts capped at {w.max_context}"
            )
        else:
            how = f"{timing.repeats} repeats of 1 vs 1+{timing.decode_tokens} tokens"
        summary = (
            f"{shape}; {how}, prompts of {timing.prompt_tokens} tokens; "
            f"outlier factor {timing.outlier_factor}"
        )
        return ProfileMetadata(
            gpu=r.gpu or self._gpu_name(),
            engine_version=self.engine_version,
            model=r.model,
            drafter=r.drafter,
            method=r.method,
            num_speculative_tokens=r.num_speculative_tokens,
            model_runner=runner,
            max_num_seqs=r.max_num_seqs,
            created_at=datetime.now(UTC),
            tool_version=__version__,
            wall_time_s=dict(self.wall),
            incomplete=incomplete,
            notes="; ".join([summary, *notes, *([r.notes] if r.notes else [])]),
            timing_method=timing.method,
            timing_shape=self._shape(),
            tensor_parallel_size=self.tensor_parallel_size,
        )

    def _shape(self) -> TimingShape | None:
        timing = self.settings.timing
        if self.in_flight:
            if not self.windows:
                return None
            return shape_of_windows(
                self.windows,
                prompt_tokens=timing.prompt_tokens,
                stream=self.settings.in_flight.prefill_stream,
            )
        return TimingShape(
            prompt_tokens=timing.prompt_tokens,
            context_tokens=timing.prompt_tokens + (timing.decode_tokens + 1) / 2,
        )

    def _write_raw(self, *, incomplete: bool, reason: str, notes: list[str]) -> None:
        record = RawRecord(
            metadata=self._metadata(incomplete=incomplete, notes=notes),
            decode_tokens=self.settings.timing.decode_tokens,
            prompt_tokens=self.settings.timing.prompt_tokens,
            batch_grid=self.grid,
            ks=self.request.profiled_ks,
            timing_method=self.settings.timing.method,
            samples=list(self.samples),
            windows=list(self.windows),
            cross_check_samples=list(self.cross_samples),
            refused_windows=list(self.refused),
            incomplete=incomplete,
            reason=reason,
        )
        save_model(record, self.paths.raw)

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> ProfileOutcome:
        r = self.request
        spec = None
        if r.attach_url is None:
            spec = EngineSpec(
                model=r.model,
                max_num_seqs=r.max_num_seqs,
                drafter=r.drafter,
                method=r.method,
                num_speculative_tokens=r.num_speculative_tokens,
                starting_table=starting_table(r.profiled_ks, r.max_num_seqs),
            )
        launch = self.settings.launch
        if self.in_flight:  # windows end on the plugin's syncs: sync often
            sync = str(self.settings.in_flight.sync_interval_s)
            launch = replace(launch, env=((SYNC_ENV, sync), *launch.env))
        session = EngineSession(
            spec=spec,
            attach_url=r.attach_url,
            launch=launch,
            connection=self.settings.connection,
            log_dir=self.paths.logs,
            reporter=self.reporter,
            engine_factory=self._factory,
        )
        self.log_text = session.first_log_text if r.engine_log is None else self._engine_log
        started = self._clock()
        try:
            with session:
                try:
                    timing, acceptance = self._measure(session)
                finally:
                    self._record_starts(session)
        except BaseException as error:
            reason = "interrupted (Ctrl-C)" if isinstance(error, KeyboardInterrupt) else str(error)
            self.wall["total"] = self._clock() - started
            self._write_raw(incomplete=True, reason=reason, notes=session.notes)
            self.reporter.note(
                f"[red]profile incomplete[/]: {reason.splitlines()[0] if reason else ''}; "
                f"raw samples so far: {self.paths.raw}"
            )
            raise
        self.wall["total"] = self._clock() - started
        return self._finish(timing, acceptance, session.notes)

    def _measure(self, session: EngineSession) -> tuple[TimingResult, AcceptanceProfile | None]:
        """Launch in the serving configuration (standard sampler), switch to "every guess
        rejected" for timing, then to the acceptance sampler. Without the hook: restarts."""
        r = self.request
        serving = SamplerMode("standard")
        timing_mode = SamplerMode.rejecting_all(r.num_speculative_tokens)
        wanted = _acceptance_mode(self.settings) if self.settings.acceptance.enabled else None

        engine = session.current(serving)
        view = engine.table()  # fails early, clearly, without the plugin
        self.engine_version = view.engine_version
        self.tensor_parallel_size = view.tensor_parallel_size
        self.allowed_k = tuple(view.allowed_k)
        missing = sorted(set(r.profiled_ks) - set(view.allowed_k))
        if missing:
            raise InputError(
                f"k {missing} are not in the server's starting table (captured: "
                f"{view.allowed_k}); serving never runs them with CUDA graphs, so their times "
                "would mislead: profile only those (--ks) or restart vLLM with a table holding them"
            )
        if session.try_switch(timing_mode):
            timing = self._timing(session.current(timing_mode))
            acceptance = None if wanted is None else self._acceptance(session.engine_in(wanted))
            return timing, acceptance
        if r.attach_url is not None:
            timing = self._timing(engine)  # valid only if the server rejects every guess
            if wanted is not None:
                session.notes.append(
                    "acceptance not measured: the attached server cannot switch its sampler and "
                    "timing needs every guess rejected"
                )
            return timing, None
        # Launched without a working hook: one restart per sampler the run still needs.
        acceptance = None
        if wanted == serving:
            acceptance = self._acceptance(engine)
        timing = self._timing(session.engine_in(timing_mode))
        if wanted is not None and acceptance is None:
            acceptance = self._acceptance(session.engine_in(wanted))
        return timing, acceptance

    def _record_starts(self, session: EngineSession) -> None:
        """Launch to /health, per launch: the first, and any restart the run needed."""
        if session.start_times_s:
            self.wall["engine_start"] = session.start_times_s[0]
        if len(session.start_times_s) > 1:
            self.wall["engine_restarts"] = sum(session.start_times_s[1:])

    def _timing(self, engine: EngineHttp) -> TimingResult:
        t = self._clock()
        result = self._in_flight(engine) if self.in_flight else self._by_request(engine)
        self.wall["timing"] = self._clock() - t
        batches = [b for b in self.settings.in_flight.cross_check if b in self.grid]
        if self.in_flight and batches:
            t = self._clock()
            request = time_by_request(
                engine,
                batches,
                self.request.profiled_ks,
                timing=self.settings.timing,
                details=result.details,
                max_num_seqs=self.request.max_num_seqs,
                temperature=self.settings.acceptance.temperature,
                reporter=self.reporter,
                on_sample=self.cross_samples.append,
            )
            self.agreement = agreement(result.samples, request)
            self.wall["cross_check"] = self._clock() - t
            self.reporter.note(
                f"in-flight vs request method on {len(self.agreement.cells)} cells: median "
                f"difference {self.agreement.median_difference:+.1%} (|.| "
                f"{self.agreement.median_abs_difference:.1%})"
            )
        return result

    def _by_request(self, engine: EngineHttp) -> TimingResult:
        measurer = TimingMeasurer(
            engine,
            settings=self.settings.timing,
            max_num_seqs=self.request.max_num_seqs,
            temperature=self.settings.acceptance.temperature,
            reporter=self.reporter,
            on_sample=self.samples.append,
        )
        result = measurer.measure(self.grid, self.request.profiled_ks)
        context = self.settings.timing.prompt_tokens + (self.settings.timing.decode_tokens + 1) / 2
        result.details = {
            (b, k): CellDetails(context_tokens=context, tokens_per_step=b * (1 + k))
            for b, k in result.samples
        }
        return result

    def _in_flight(self, engine: EngineHttp) -> TimingResult:
        before = engine.counters()
        traffic = self._traffic_factory(engine)
        try:
            measurer = InFlightMeasurer(
                engine,
                traffic,
                settings=self.settings.timing,
                in_flight=self.settings.in_flight,
                max_num_seqs=self.request.max_num_seqs,
                reporter=self.reporter,
                on_window=self.windows.append,
                clock=self._wait[0],
                sleep=self._wait[1],
            )
            try:
                result = measurer.measure(self.grid, self.request.profiled_ks)
            finally:  # (an interrupted run's .raw.json shows where its time went too)
                self.refused = list(measurer.refused)
                self.wall.update({f"timing.{n}": s for n, s in measurer.phases_s.items()})
        finally:
            traffic.close()
        check_all_rejected(engine.counters().minus(before))
        if result.refused:
            self.reporter.note(f"{len(result.refused)} window(s) taken again: {result.refused[0]}")
        return result

    def _engine_log(self) -> str:
        assert self.request.engine_log is not None
        try:
            return self.request.engine_log.read_text(encoding="utf-8", errors="replace")
        except OSError as error:
            raise InputError(
                f"--engine-log: cannot read {self.request.engine_log}: {error}"
            ) from None

    def _capture(self) -> CaptureConfig:
        """The engine's capture sizes (its log, else vLLM 0.26's rule for its arguments)."""
        r = self.request
        return capture_config_from_log(self.log_text()) or capture_config_from_args(
            self.settings.launch.extra_args,
            max_num_seqs=r.max_num_seqs,
            num_speculative_tokens=r.num_speculative_tokens,
        )

    def _acceptance(self, engine: EngineHttp) -> AcceptanceProfile:
        t = self._clock()
        prompts, source = _acceptance_prompts(self.settings, engine)
        r = self.request
        profile = measure_acceptance(
            engine,
            prompts=prompts,
            prompt_source=source,
            num_speculative_tokens=r.num_speculative_tokens,
            max_num_seqs=r.max_num_seqs,
            settings=self.settings.acceptance,
            reporter=self.reporter,
            model=r.model,
            drafter=r.drafter,
            method=r.method,
        )
        self.wall["acceptance"] = self._clock() - t
        return profile

    def _finish(
        self, timing: TimingResult, acceptance: AcceptanceProfile | None, notes: list[str]
    ) -> ProfileOutcome:
        notes = list(notes)
        if timing.noisy:
            notes.append(
                "noisy cells kept as measured: "
                + ", ".join(f"B={b} k={k}" for b, k in sorted(timing.noisy))
            )
        self._write_raw(incomplete=False, reason="", notes=notes)
        profile = with_cuda_graphs(
            Profile(
                metadata=self._metadata(incomplete=False, notes=notes),
                statistic="median",
                batch_grid=self.grid,
                ks=self.request.profiled_ks,
                cells=build_cells(timing.samples, timing.noisy, timing.details),
                acceptance=acceptance,
            ),
            self._capture(),
            table_ks=self.allowed_k or self.request.profiled_ks,
        )
        save_model(profile, self.paths.profile)
        solution = None
        if acceptance is not None:
            save_model(acceptance, self.paths.acceptance)
            solution = build_table(step_times_of(profile), acceptance.rates, allowed_k=profile.ks)
            save_model(Table.parse([list(x) for x in solution.ranges]), self.paths.table)
        if self.request.plots:
            from tabletune.profiler import plots

            plots.heatmap(profile, self.paths.heatmap)
            if acceptance is not None and solution is not None:
                plots.goodput_plot(profile, acceptance.rates, self.paths.goodput)
                plots.chosen_k_plot(profile, solution, self.paths.chosen_k)
        outcome = ProfileOutcome(
            profile, acceptance, solution, self.paths, dict(self.wall), notes, self.agreement
        )
        self.paths.summary.write_text(json.dumps(summary_of(outcome, timing), indent=2) + "\n")
        return outcome


def summary_of(outcome: ProfileOutcome, timing: TimingResult) -> dict[str, Any]:
    meta = outcome.profile.metadata
    return {
        "kind": "tabletune.profile-summary",
        "device": meta.gpu,
        "engine": meta.engine,
        "engine_version": meta.engine_version,
        "tensor_parallel_size": meta.tensor_parallel_size,
        "date": meta.created_at.isoformat(),
        "model": meta.model,
        "drafter": meta.drafter,
        "method": meta.method,
        "num_speculative_tokens": meta.num_speculative_tokens,
        "max_num_seqs": meta.max_num_seqs,
        "batch_grid": list(outcome.profile.batch_grid),
        "ks": list(outcome.profile.ks),
        "wall_time_s": {k: round(v, 2) for k, v in outcome.wall_time_s.items()},
        "cells": len(outcome.profile.cells),
        "timing_method": meta.timing_method,
        "timing_shape": None if meta.timing_shape is None else meta.timing_shape.model_dump(),
        "remeasured": [list(c) for c in timing.remeasured],
        "noisy": [list(c) for c in sorted(timing.noisy)],
        "windows_taken_again": len(timing.refused),
        "in_flight_events": dict(timing.events) or None,
        "cuda_graphs": {
            "max_capture_size": None
            if meta.cuda_graphs is None
            else meta.cuda_graphs.max_capture_size,
            "not_full": {
                f"{c.batch_size},{c.k}": c.cuda_graph
                for c in outcome.profile.cells
                if c.cuda_graph not in (None, "full")
            },
        },
        "cross_check": None if outcome.agreement is None else outcome.agreement.to_json(),
        "step_ms": {
            str(k): {
                str(c.batch_size): round(c.step_ms, 3) for c in outcome.profile.cells if c.k == k
            }
            for k in outcome.profile.ks
        },
        "context_tokens": round(
            statistics.fmean(c.context_tokens for c in outcome.profile.cells if c.context_tokens),
            1,
        )
        if any(c.context_tokens for c in outcome.profile.cells)
        else None,
        "acceptance": None
        if outcome.acceptance is None
        else {
            "rates": [round(a, 4) for a in outcome.acceptance.rates],
            "num_drafts": outcome.acceptance.num_drafts,
            "accepted_per_pos": list(outcome.acceptance.accepted_per_pos or ()),
            "notes": outcome.acceptance.notes,
        },
        "table": None if outcome.solution is None else [list(r) for r in outcome.solution.ranges],
        "notes": outcome.notes,
        "files": {name: str(path) for name, path in vars(outcome.paths).items()},
    }
