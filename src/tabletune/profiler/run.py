"""``tabletune profile`` end to end: engine, timing, acceptance, files. The server is always
stopped; whatever was measured is written even when the run fails or is interrupted."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from tabletune import __version__
from tabletune.errors import InputError
from tabletune.profiler.acceptance import measure_acceptance
from tabletune.profiler.engine import EngineHttp
from tabletune.profiler.hook_protocol import SamplerMode
from tabletune.profiler.measure import TimingMeasurer, TimingResult
from tabletune.profiler.progress import Reporter
from tabletune.profiler.prompts import Prompt, TokenPrompts, load_prompt_set
from tabletune.profiler.records import RawRecord, RawSample
from tabletune.profiler.server import EngineSpec, starting_table
from tabletune.profiler.session import EngineFactory, EngineSession
from tabletune.profiler.settings import ProfilerSettings
from tabletune.profiler.timing import batch_grid, build_cells, explicit_grid
from tabletune.schemas import AcceptanceProfile, Profile, ProfileMetadata, Table, save_model
from tabletune.schemas.profile import step_times_of
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


def _acceptance_prompts(settings: ProfilerSettings) -> tuple[list[Prompt], str]:
    acc = settings.acceptance
    if acc.prompts_path:
        return load_prompt_set(acc.prompts_path, limit=acc.num_prompts), acc.prompts_path
    timing = settings.timing
    generator = TokenPrompts(
        length=timing.prompt_tokens,
        low=timing.token_id_low,
        high=timing.token_id_high,
        seed=timing.seed + 1,
    )
    source = (
        f"synthetic token ids ({acc.num_prompts} x {timing.prompt_tokens}, seed {timing.seed + 1})"
    )
    return list(generator.take(acc.num_prompts)), source


class ProfileRun:
    """One ``tabletune profile`` run."""

    def __init__(
        self,
        request: ProfileRequest,
        *,
        settings: ProfilerSettings,
        reporter: Reporter,
        engine_factory: EngineFactory | None = None,
        clock: Callable[[], float] = time.monotonic,
        gpu_name: Callable[[], str] = detect_gpu,
    ) -> None:
        self.request = request
        self.settings = settings
        self.reporter = reporter
        self.paths = OutputPaths.beside(request.output)
        self._factory = engine_factory
        self._clock = clock
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
        self.engine_version = "unknown"

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
        summary = (
            f"{shape}; "
            f"{timing.repeats} repeats of 1 vs 1+{timing.decode_tokens} tokens, "
            f"prompts of {timing.prompt_tokens} tokens; outlier factor {timing.outlier_factor}"
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
        )

    def _write_raw(self, *, incomplete: bool, reason: str, notes: list[str]) -> None:
        record = RawRecord(
            metadata=self._metadata(incomplete=incomplete, notes=notes),
            decode_tokens=self.settings.timing.decode_tokens,
            prompt_tokens=self.settings.timing.prompt_tokens,
            batch_grid=self.grid,
            ks=self.request.profiled_ks,
            samples=list(self.samples),
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
        session = EngineSession(
            spec=spec,
            attach_url=r.attach_url,
            launch=self.settings.launch,
            connection=self.settings.connection,
            log_dir=self.paths.logs,
            reporter=self.reporter,
            engine_factory=self._factory,
        )
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
        measurer = TimingMeasurer(
            engine,
            settings=self.settings.timing,
            max_num_seqs=self.request.max_num_seqs,
            temperature=self.settings.acceptance.temperature,
            reporter=self.reporter,
            on_sample=self.samples.append,
        )
        result = measurer.measure(self.grid, self.request.profiled_ks)
        self.wall["timing"] = self._clock() - t
        return result

    def _acceptance(self, engine: EngineHttp) -> AcceptanceProfile:
        t = self._clock()
        prompts, source = _acceptance_prompts(self.settings)
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
        cells = build_cells(timing.samples, timing.noisy)
        profile = Profile(
            metadata=self._metadata(incomplete=False, notes=notes),
            statistic="median",
            batch_grid=self.grid,
            ks=self.request.profiled_ks,
            cells=cells,
            acceptance=acceptance,
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
        outcome = ProfileOutcome(profile, acceptance, solution, self.paths, dict(self.wall), notes)
        self.paths.summary.write_text(json.dumps(summary_of(outcome, timing), indent=2) + "\n")
        return outcome


def summary_of(outcome: ProfileOutcome, timing: TimingResult) -> dict[str, Any]:
    meta = outcome.profile.metadata
    return {
        "kind": "tabletune.profile-summary",
        "device": meta.gpu,
        "engine": meta.engine,
        "engine_version": meta.engine_version,
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
        "remeasured": [list(c) for c in timing.remeasured],
        "noisy": [list(c) for c in sorted(timing.noisy)],
        "step_ms": {
            str(k): {
                str(c.batch_size): round(c.step_ms, 3) for c in outcome.profile.cells if c.k == k
            }
            for k in outcome.profile.ks
        },
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
