"""``tabletune profile --attach`` against the fake engine (virtual time: exact step times)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from tabletune.errors import InputError, PermanentError, TemporaryError
from tabletune.profiler.engine import EngineHttp
from tabletune.profiler.errors import MeasurementError, NoPluginError
from tabletune.profiler.hook_protocol import SamplerMode
from tabletune.profiler.progress import QuietReporter
from tabletune.profiler.records import RawRecord
from tabletune.profiler.run import ProfileRequest, ProfileRun
from tabletune.profiler.settings import (
    AcceptanceSettings,
    ConnectionSettings,
    GridSettings,
    ProfilerSettings,
    TimingSettings,
)
from tabletune.schemas import load_acceptance, load_profile, load_table
from tabletune.schemas.profile import step_times_of
from tabletune.solver import build_table
from tests.unit.test_profiler_fake_engine import FakeConfig, FakeEngine, linear_steps

MAX = 32
SETTINGS = ProfilerSettings(
    grid=GridSettings(dense_until=4, step=8),  # 1,2,3,4,12,20,28,32
    timing=TimingSettings(method="request", warmup_batches=(1,), repeats=3, decode_tokens=64),
    acceptance=AcceptanceSettings(num_prompts=40, max_tokens=65, concurrency=16),
    connection=ConnectionSettings(request_timeout_s=5.0, retry_backoffs_s=(1.0, 2.0, 4.0)),
)
GRID = (1, 2, 3, 4, 12, 20, 28, 32)


class Harness:
    def __init__(self, tmp_path: Path, config: FakeConfig) -> None:
        self.fake = FakeEngine(config)
        self.tmp_path = tmp_path
        self.slept: list[float] = []
        self.clock: Callable[[], float] = self.fake.clock.now
        self.modes_seen: list[str] = []

    def factory(self, settings: ProfilerSettings) -> Callable[[str], EngineHttp]:
        def make(url: str) -> EngineHttp:
            return EngineHttp(
                url,
                settings=settings.connection,
                clock=lambda: self.clock(),
                sleep=self.slept.append,
            )

        return make

    def run(
        self,
        url: str,
        *,
        settings: ProfilerSettings = SETTINGS,
        ks: tuple[int, ...] | None = None,
        reporter: QuietReporter | None = None,
    ) -> tuple[ProfileRun, QuietReporter]:
        reporter = reporter or QuietReporter()
        request = ProfileRequest(
            output=self.tmp_path / "out" / "h200-test.json",
            model="/models/fake",
            drafter="/models/fake-eagle3",
            method="eagle3",
            num_speculative_tokens=3,
            max_num_seqs=MAX,
            attach_url=url,
            ks=ks,
            gpu="FAKE GPU",
            model_runner="v2",
        )
        run = ProfileRun(
            request,
            settings=settings,
            reporter=reporter,
            engine_factory=self.factory(settings),
            clock=lambda: self.clock(),
        )
        run.run()
        return run, reporter


def serving(tmp_path: Path, **changes: object) -> tuple[Harness, FakeEngine]:
    harness = Harness(tmp_path, replace(FakeConfig(max_num_seqs=MAX), **changes))  # type: ignore[arg-type]
    return harness, harness.fake


def synthetic(*rates: float) -> AcceptanceSettings:
    return replace(SETTINGS.acceptance, synthetic_rates=rates)


def test_the_engines_tensor_parallel_size_is_recorded(tmp_path: Path) -> None:
    # A profile holds for one parallel layout: the one the engine's table view reports.
    harness, fake = serving(tmp_path, tensor_parallel_size=2)
    settings = replace(SETTINGS, acceptance=synthetic(0.75, 0.55, 0.40))
    with fake.serve() as url:
        run, _ = harness.run(url, settings=settings, ks=(0, 1))
    assert load_profile(run.paths.profile).metadata.tensor_parallel_size == 2


def test_step_times_are_exact_and_every_file_is_written(tmp_path: Path) -> None:
    harness, fake = serving(tmp_path)
    settings = replace(SETTINGS, acceptance=synthetic(0.75, 0.55, 0.40))
    with fake.serve() as url:
        run, _ = harness.run(url, settings=settings)
    paths = run.paths
    profile = load_profile(paths.profile)
    assert profile.batch_grid == GRID
    assert profile.ks == (0, 1, 2, 3)
    step = linear_steps()
    for cell in profile.cells:
        assert cell.step_ms == pytest.approx(step(cell.batch_size, cell.k), rel=1e-9)
        assert len(cell.samples_ms) == 3
        assert not cell.noisy
    meta = profile.metadata
    assert (meta.gpu, meta.engine_version, meta.model_runner) == ("FAKE GPU", "0.26.0", "v2")
    assert meta.tensor_parallel_size == 1  # as the engine's table view reported it
    assert {"timing", "acceptance", "total"} <= set(meta.wall_time_s)
    # acceptance: the synthetic rates come back through vLLM's counters
    acceptance = load_acceptance(paths.acceptance)
    assert acceptance.rates == pytest.approx((0.75, 0.55, 0.40), abs=1e-9)
    assert acceptance.num_drafts > 0
    assert profile.acceptance == acceptance
    # the table is the solver's for these numbers
    table = load_table(str(paths.table))
    expected = build_table(step_times_of(profile), acceptance.rates, allowed_k=profile.ks)
    assert table.ranges == expected.ranges
    for png in (paths.heatmap, paths.goodput, paths.chosen_k):
        assert png.read_bytes()[:4] == b"\x89PNG"
    summary = json.loads(paths.summary.read_text())
    assert summary["acceptance"]["rates"] == [0.75, 0.55, 0.4]
    raw = RawRecord.model_validate_json(paths.raw.read_text())
    assert not raw.incomplete and len(raw.samples) == len(GRID) * 4 * 3


def test_sampler_is_switched_for_timing_and_restored_for_acceptance(tmp_path: Path) -> None:
    harness, fake = serving(tmp_path)
    with fake.serve() as url:
        run, _ = harness.run(url)  # serving sampler: standard (fake accepts 0.6/0.4/0.2)
    assert fake.config.sampler == SamplerMode("standard")
    acceptance = load_acceptance(run.paths.acceptance)
    assert acceptance.rates == pytest.approx((0.6, 0.4, 0.2))
    assert "standard" in acceptance.notes
    # every timed completion ran with k as set and (per the counters check) nothing accepted
    timed = [c for c in fake.completions if c[1] == 65]
    assert {c[2] for c in timed} >= {0, 1, 2, 3}


def test_a_persistent_jump_is_kept_and_flagged_a_transient_one_is_remeasured(
    tmp_path: Path,
) -> None:
    base = linear_steps()
    calls = {"transient": 0}

    def step(b: int, k: int) -> float:
        if (b, k) == (3, 2):  # like the H200's k=2 cell at B=4: ~3x its neighbours, every time
            return 3 * base(b, k)
        if (b, k) == (20, 1):
            calls["transient"] += 1
            # the first pass (3 short + 3 long requests) is slow, the re-measure is not
            return 4 * base(b, k) if calls["transient"] <= 6 else base(b, k)
        return base(b, k)

    harness, fake = serving(tmp_path, step_ms=step)
    with fake.serve() as url:
        run, reporter = harness.run(url)
    profile = load_profile(run.paths.profile)
    cells = {(c.batch_size, c.k): c for c in profile.cells}
    jump = cells[(3, 2)]
    assert jump.noisy
    assert jump.step_ms == pytest.approx(3 * base(3, 2))  # kept as measured, not smoothed
    assert len(jump.samples_ms) == 6  # first pass + one re-measure round, all kept
    transient = cells[(20, 1)]
    assert not transient.noisy
    assert transient.samples_ms == pytest.approx([base(20, 1)] * 3)  # the undisturbed round
    raw = RawRecord.model_validate_json(run.paths.raw.read_text())
    disturbed = [s for s in raw.samples if (s.batch_size, s.k) == (20, 1)]
    assert [s.round for s in disturbed] == [0, 0, 0, 1, 1, 1]  # every sample kept in the raw
    assert disturbed[0].step_ms == pytest.approx(4 * base(20, 1))
    assert any("B=3 k=2" in note and "noisy" in note for note in reporter.notes)
    assert "B=3 k=2" in profile.metadata.notes


def test_temporary_errors_are_retried_on_the_schedule(tmp_path: Path) -> None:
    harness, fake = serving(tmp_path)
    fake.fail_next = [500, 503]
    with fake.serve() as url:
        run, _ = harness.run(url, settings=replace(SETTINGS, acceptance=synthetic(0.5, 0.3, 0.1)))
    assert harness.slept == [1.0, 2.0]
    assert load_profile(run.paths.profile).cells


def test_a_timeout_is_retried(tmp_path: Path) -> None:
    harness, fake = serving(tmp_path)
    fake.hang_next = 1
    # Only the hung request times out: at 0.3 s a busy CI machine (2 cores) once timed out the
    # next, ordinary one too, and the retry schedule read two waits.
    fake.hang_s = 4.0
    settings = replace(SETTINGS, connection=replace(SETTINGS.connection, request_timeout_s=1.5))
    with fake.serve() as url:
        harness.run(url, settings=settings)
    assert harness.slept == [1.0]


def test_giving_up_writes_the_samples_so_far_marked_incomplete(tmp_path: Path) -> None:
    harness, fake = serving(tmp_path)
    with fake.serve() as url:
        original = fake.serve_completion
        served = {"n": 0}

        def failing_after_some(b: int, max_tokens: int) -> float:
            served["n"] += 1
            if served["n"] == 12:
                fake.fail_next = [502] * 4
            return original(b, max_tokens)

        fake.serve_completion = failing_after_some  # type: ignore[method-assign]
        with pytest.raises(TemporaryError, match="gave up after 4 attempts"):
            harness.run(url)
    assert harness.slept == [1.0, 2.0, 4.0]
    raw = RawRecord.model_validate_json((tmp_path / "out" / "h200-test.raw.json").read_text())
    assert raw.incomplete and raw.metadata.incomplete
    assert "gave up" in raw.reason
    assert 0 < len(raw.samples) < len(GRID) * 4 * 3
    assert not (tmp_path / "out" / "h200-test.json").exists()


def test_a_refused_request_is_not_retried(tmp_path: Path) -> None:
    harness, fake = serving(tmp_path)
    fake.fail_next = [400]
    with fake.serve() as url, pytest.raises(PermanentError, match="HTTP 400"):
        harness.run(url)
    assert harness.slept == []


def test_ctrl_c_writes_partial_samples_and_propagates(tmp_path: Path) -> None:
    harness, fake = serving(tmp_path)
    reads = {"n": 0}

    def interrupting_clock() -> float:
        reads["n"] += 1
        if reads["n"] == 60:
            raise KeyboardInterrupt
        return fake.clock.now()

    harness.clock = interrupting_clock
    with fake.serve() as url, pytest.raises(KeyboardInterrupt):
        harness.run(url)
    raw = RawRecord.model_validate_json((tmp_path / "out" / "h200-test.raw.json").read_text())
    assert raw.incomplete and raw.reason == "interrupted (Ctrl-C)"
    assert raw.samples


def test_a_server_without_the_plugin_is_refused_clearly(tmp_path: Path) -> None:
    harness, fake = serving(tmp_path, plugin=False)
    with fake.serve() as url, pytest.raises(NoPluginError, match="VLLM_PLUGINS"):
        harness.run(url)
    assert fake.completions == []


def test_without_the_hook_a_serving_sampler_fails_timing(tmp_path: Path) -> None:
    harness, fake = serving(tmp_path, dev_mode=False)
    with fake.serve() as url, pytest.raises(MeasurementError, match="not in timing mode"):
        harness.run(url)


def test_without_the_hook_a_server_in_timing_mode_is_timed_and_acceptance_skipped(
    tmp_path: Path,
) -> None:
    harness, fake = serving(tmp_path, hook=False, sampler=SamplerMode.rejecting_all(3))
    with fake.serve() as url:
        run, reporter = harness.run(url)
    profile = load_profile(run.paths.profile)
    assert profile.acceptance is None
    assert not run.paths.acceptance.exists() and not run.paths.table.exists()
    assert "acceptance not measured" in profile.metadata.notes
    assert any("sampler switch unavailable" in note for note in reporter.notes)


def test_a_table_swap_that_does_not_take_effect_is_caught(tmp_path: Path) -> None:
    harness, fake = serving(tmp_path, table_swap_works=False)
    with fake.serve() as url, pytest.raises(MeasurementError, match="did not take effect"):
        harness.run(url)


def test_a_server_that_stops_at_eos_is_caught(tmp_path: Path) -> None:
    harness, fake = serving(tmp_path, honour_ignore_eos=False)
    with fake.serve() as url, pytest.raises(MeasurementError, match="ignore_eos"):
        harness.run(url)


def test_k_outside_the_starting_table_is_refused_before_measuring(tmp_path: Path) -> None:
    harness, fake = serving(tmp_path, starting_table=[[1, 1, 3], [2, MAX, 0]])
    with fake.serve() as url, pytest.raises(InputError, match=r"k \[1, 2\]"):
        harness.run(url)
    assert fake.completions == []


def test_an_explicit_grid_is_profiled_as_given(tmp_path: Path) -> None:
    harness, fake = serving(tmp_path)
    settings = replace(SETTINGS, grid=GridSettings(explicit=(5, 6, 7, 8)))
    with fake.serve() as url:
        run, _ = harness.run(url, settings=settings)
    profile = load_profile(run.paths.profile)
    assert profile.batch_grid == (5, 6, 7, 8)
    assert "explicit grid" in profile.metadata.notes


def test_only_the_starting_tables_k_when_asked(tmp_path: Path) -> None:
    harness, fake = serving(tmp_path, starting_table=[[1, 1, 3], [2, MAX, 0]])
    with fake.serve() as url:
        run, _ = harness.run(url, ks=(0, 3))
    profile = load_profile(run.paths.profile)
    assert profile.ks == (0, 3)
    assert set(load_table(str(run.paths.table)).ks) <= {0, 3}


@pytest.mark.parametrize(
    ("tokenizer", "source"),
    [(True, "bundled chat prompts (chat_prompts.jsonl, 40, text)"), (False, "synthetic token ids")],
)
def test_acceptance_prompts_are_the_bundled_text_when_the_server_tokenizes(
    tmp_path: Path, tokenizer: bool, source: str
) -> None:
    harness, fake = serving(tmp_path, tokenizer=tokenizer)
    settings = replace(SETTINGS, acceptance=synthetic(0.75, 0.55, 0.40))
    with fake.serve() as url:
        run, _ = harness.run(url, settings=settings)
    acceptance = load_acceptance(run.paths.acceptance)
    assert acceptance.prompt_source.startswith(source)
    assert harness.slept == []  # the probe is not retried: a refusal is an answer
    assert acceptance.rates == pytest.approx((0.75, 0.55, 0.40), abs=1e-9)
