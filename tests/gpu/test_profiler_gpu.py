"""GPU tier: ``tabletune profile`` against a real vLLM 0.26 with the plugin (skipped without).

Run on a GPU host with vLLM 0.26 and this package installed, e.g.
``pytest -m gpu tests/gpu/test_profiler_gpu.py``. It launches dummy-weight Qwen3-4B + EAGLE-3
shapes (their config folders under /tmp/models: ``--load-format dummy``), times a small grid in
one launch and checks the synthetic rates come back through vLLM's counters.
bench/gpu/profile_h200.sh is the full-size run.
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
    LaunchSettings,
    ProfilerSettings,
    TimingSettings,
)
from tabletune.schemas import load_profile

MODELS = Path("/tmp/models")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None or not (MODELS / "qwen3-4b").exists(),
        reason="needs vLLM 0.26 and the model configs under /tmp/models (a GPU host)",
    ),
]


def test_one_launch_times_every_k_and_reads_the_synthetic_rates_back(tmp_path: Path) -> None:
    settings = ProfilerSettings(
        grid=GridSettings(dense_until=4, step=28),  # 1, 2, 3, 4, 32
        timing=TimingSettings(
            method="request", repeats=3, decode_tokens=32, warmup_batches=(1, 32)
        ),
        acceptance=AcceptanceSettings(max_tokens=256, synthetic_rates=(0.75, 0.55, 0.40)),
        launch=LaunchSettings(
            extra_args=("--load-format", "dummy", "--skip-tokenizer-init"),
        ),
    )
    request = ProfileRequest(
        output=tmp_path / "gpu.json",
        model=str(MODELS / "qwen3-4b"),
        drafter=str(MODELS / "qwen3-4b-eagle3"),
        num_speculative_tokens=3,
        max_num_seqs=32,
    )
    outcome = ProfileRun(request, settings=settings, reporter=QuietReporter()).run()
    profile = load_profile(outcome.paths.profile)
    assert profile.ks == (0, 1, 2, 3)
    assert all(cell.step_ms > 0 for cell in profile.cells)
    assert "engine_restarts" not in profile.metadata.wall_time_s  # the hook switched samplers
    assert outcome.acceptance is not None
    assert outcome.acceptance.rates == pytest.approx((0.75, 0.55, 0.40), abs=0.02)
