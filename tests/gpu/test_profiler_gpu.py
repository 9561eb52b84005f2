"""GPU tier: ``tabletune profile`` against a real vLLM 0.26 with the plugin (skipped without).

Run on a GPU host with vLLM 0.26 and this package installed, e.g.
``pytest -m gpu tests/gpu/test_profiler_gpu.py``. It launches dummy-weight Qwen3-4B + EAGLE-3
shapes (their config folders under /tmp/models: ``--load-format dummy``), times a small grid in
one launch and checks the synthetic rates come back through vLLM's counters. The in-flight test
also runs the request method on two batch sizes in the same launch, reads the capture sizes
from vLLM's log, and uses the bundled text prompts when the model folder has a tokenizer
(device-setup.sh writes a synthetic one). bench/gpu/profile_fast.sh is the full-size run.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tabletune.profiler.progress import QuietReporter
from tabletune.profiler.run import ProfileRequest, ProfileRun
from tabletune.profiler.settings import (
    AcceptanceSettings,
    GridSettings,
    InFlightSettings,
    LaunchSettings,
    ProfilerSettings,
    TimingSettings,
)
from tabletune.schemas import load_profile

MODELS = Path("/tmp/models")
RATES = (0.75, 0.55, 0.40)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None or not (MODELS / "qwen3-4b").exists(),
        reason="needs vLLM 0.26 and the model configs under /tmp/models (a GPU host)",
    ),
]


def request(tmp_path: Path) -> ProfileRequest:
    return ProfileRequest(
        output=tmp_path / "gpu.json",
        model=str(MODELS / "qwen3-4b"),
        drafter=str(MODELS / "qwen3-4b-eagle3"),
        num_speculative_tokens=3,
        max_num_seqs=32,
    )


def test_one_launch_times_every_k_and_reads_the_synthetic_rates_back(tmp_path: Path) -> None:
    settings = ProfilerSettings(
        grid=GridSettings(dense_until=4, step=28),  # 1, 2, 3, 4, 32
        timing=TimingSettings(
            method="request", repeats=3, decode_tokens=32, warmup_batches=(1, 32)
        ),
        acceptance=AcceptanceSettings(max_tokens=256, synthetic_rates=RATES),
        launch=LaunchSettings(
            extra_args=("--load-format", "dummy", "--skip-tokenizer-init"),
        ),
    )
    outcome = ProfileRun(request(tmp_path), settings=settings, reporter=QuietReporter()).run()
    profile = load_profile(outcome.paths.profile)
    assert profile.ks == (0, 1, 2, 3)
    assert all(cell.step_ms > 0 for cell in profile.cells)
    assert "engine_restarts" not in profile.metadata.wall_time_s  # the hook switched samplers
    assert outcome.acceptance is not None
    assert outcome.acceptance.rates == pytest.approx(RATES, abs=0.02)


def test_in_flight_agrees_with_the_request_method_and_names_the_graphless_cells(
    tmp_path: Path,
) -> None:
    tokenizer = (MODELS / "qwen3-4b" / "tokenizer.json").exists()
    args = ("--load-format", "dummy") + (() if tokenizer else ("--skip-tokenizer-init",))
    settings = ProfilerSettings(
        grid=GridSettings(dense_until=4, step=28),  # 1, 2, 3, 4, 32
        timing=TimingSettings(repeats=3, decode_tokens=16, warmup_batches=(1, 32)),
        in_flight=InFlightSettings(cross_check=(1, 32)),
        acceptance=AcceptanceSettings(num_prompts=64, max_tokens=128, synthetic_rates=RATES),
        launch=LaunchSettings(extra_args=args),
    )
    outcome = ProfileRun(request(tmp_path), settings=settings, reporter=QuietReporter()).run()
    profile = load_profile(outcome.paths.profile)
    meta = profile.metadata
    assert meta.timing_method == "in-flight"
    assert meta.cuda_graphs is not None and meta.cuda_graphs.source == "engine log"
    cells = {(c.batch_size, c.k): c for c in profile.cells}
    assert cells[(3, 0)].cuda_graph == "eager" and cells[(3, 0)].step_ms > 2 * cells[(4, 0)].step_ms
    assert all(c.tokens_per_step == c.batch_size * (1 + c.k) for c in profile.cells)
    assert outcome.agreement is not None and len(outcome.agreement.cells) == 2 * 4
    assert abs(outcome.agreement.median_difference) <= 0.05
    assert outcome.acceptance is not None
    assert outcome.acceptance.rates == pytest.approx(RATES, abs=0.02)
    expected = "bundled chat prompts" if tokenizer else "synthetic token ids"
    assert expected in outcome.acceptance.prompt_source
