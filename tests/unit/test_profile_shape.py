"""The profile's optional timing metadata (shape, CUDA graphs, per-cell notes) and the live-shape
check the daemon and ``tabletune compare`` call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from tabletune.schemas import load_profile, save_model
from tabletune.schemas.profile import CudaGraphCapture, Profile
from tabletune.schemas.shape import PrefillStream, TimingShape, profile_shape_mismatch

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample-profile.json"
H200 = ROOT / "profiles" / "h200-qwen3-4b-eagle3.json"
OLD_PROFILES = [SAMPLE, H200]


def test_profiles_written_before_the_new_fields_still_load() -> None:
    profile = load_profile(SAMPLE)
    assert profile.metadata.timing_method is None
    assert profile.metadata.timing_shape is None and profile.metadata.cuda_graphs is None
    assert all(c.cuda_graph is None and c.context_tokens is None for c in profile.cells)


def test_the_measured_h200_profile_says_which_cells_run_without_a_full_graph() -> None:
    profile = load_profile(H200)
    meta = profile.metadata
    assert meta.timing_method == "request" and meta.cuda_graphs is not None
    assert meta.cuda_graphs.max_capture_size == 512
    cells = {(c.batch_size, c.k): c for c in profile.cells}
    for b in (3, 5, 6, 9):
        assert cells[(b, 0)].cuda_graph == "eager" and "bucket" in cells[(b, 0)].note
    assert cells[(136, 3)].cuda_graph == "eager" and "exceed" in cells[(136, 3)].note
    assert "B=3 k=0 eager" in meta.notes


def test_the_new_fields_round_trip(tmp_path: Path) -> None:
    data = json.loads(OLD_PROFILES[0].read_text())
    data["metadata"].update(
        timing_method="in-flight",
        timing_shape={
            "prompt_tokens": 32,
            "context_tokens": 120.5,
            "extra_tokens_per_step": 3.5,
            "prefill_stream": {"requests_per_s": 4.0, "prompt_tokens": [100, 900]},
        },
        cuda_graphs={"max_capture_size": 512, "capture_sizes": [1, 2, 4], "source": "engine log"},
    )
    data["cells"][0].update(
        context_tokens=99.0, tokens_per_step=4.0, cuda_graph="eager", note="no graph"
    )
    profile = Profile.model_validate(data)
    save_model(profile, tmp_path / "p.json")
    again = load_profile(tmp_path / "p.json")
    assert again == profile
    assert again.metadata.timing_shape is not None
    assert again.metadata.timing_shape.prefill_stream == PrefillStream(
        requests_per_s=4.0, prompt_tokens=(100, 900)
    )
    assert again.metadata.cuda_graphs == CudaGraphCapture(
        max_capture_size=512, capture_sizes=(1, 2, 4), source="engine log"
    )
    assert again.cells[0].cuda_graph == "eager"


@pytest.mark.parametrize(
    "bad",
    [
        {"requests_per_s": 0, "prompt_tokens": [1, 2]},
        {"requests_per_s": 1, "prompt_tokens": [5, 2]},
        {"requests_per_s": 1, "prompt_tokens": [0, 2]},
    ],
)
def test_a_prefill_stream_needs_a_rate_and_a_range(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PrefillStream.model_validate(bad)


def test_pure_decode_live_steps_match_a_pure_decode_profile() -> None:
    shape = TimingShape(prompt_tokens=32, context_tokens=100, extra_tokens_per_step=0)
    assert profile_shape_mismatch(shape, k=3, live_batch=64, live_tokens_per_step=256) == []
    assert profile_shape_mismatch(None, k=0, live_batch=8, live_tokens_per_step=8 + 15) == []


def test_prefill_riding_along_live_warns_against_a_pure_decode_profile() -> None:
    problems = profile_shape_mismatch(
        TimingShape(prompt_tokens=32), k=3, live_batch=128, live_tokens_per_step=512 + 300
    )
    assert len(problems) == 1
    assert "300 prefill tokens per step" in problems[0] and "read low" in problems[0]
    # a stream profile against pure-decode live traffic: the other way round
    stream = TimingShape(prompt_tokens=32, extra_tokens_per_step=200)
    (problem,) = profile_shape_mismatch(stream, k=1, live_batch=64, live_tokens_per_step=128)
    assert "fewer tokens per step" in problem and "read high" in problem


def test_contexts_far_from_the_profiles_warn() -> None:
    shape = TimingShape(prompt_tokens=32, context_tokens=150)
    kwargs = {"k": 2, "live_batch": 32.0, "live_tokens_per_step": 96.0}
    assert profile_shape_mismatch(shape, live_context_tokens=300, **kwargs) == []  # 150 tokens
    (problem,) = profile_shape_mismatch(shape, live_context_tokens=2000, **kwargs)
    assert "contexts average 2000 tokens" in problem
    assert profile_shape_mismatch(None, live_context_tokens=2000, **kwargs) == []  # unknown


def test_impossible_live_numbers_are_refused() -> None:
    with pytest.raises(ValueError, match="live_batch > 0"):
        profile_shape_mismatch(None, k=1, live_batch=0, live_tokens_per_step=1)


@given(
    k=st.integers(0, 8),
    batch=st.integers(1, 1024),
    extra=st.integers(0, 100_000),
    timed=st.integers(0, 100_000),
)
def test_the_check_warns_exactly_when_extra_tokens_differ_beyond_the_margin(
    k: int, batch: int, extra: int, timed: int
) -> None:
    shape = TimingShape(prompt_tokens=32, extra_tokens_per_step=timed)
    decode = batch * (1 + k)
    problems = profile_shape_mismatch(
        shape, k=k, live_batch=batch, live_tokens_per_step=decode + extra
    )
    assert bool(problems) == (abs(extra - timed) > max(16.0, 0.1 * decode))


def test_compare_warns_when_the_live_shape_is_not_the_profiles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tabletune.cli.main import main

    out = tmp_path / "cmp.json"
    h200 = str(OLD_PROFILES[1])  # pure decode, 32-token prompts
    args = ["compare", "--profile", h200, "--json-out", str(out)]
    assert main([*args, "--live-shape", "3:127:508", "--live-shape", "1:64:128"]) == 0
    assert "WARNING" not in capsys.readouterr().out
    assert json.loads(out.read_text())["shape_warnings"] == []
    assert main([*args, "--live-shape", "3:127:1100"]) == 0
    printed = capsys.readouterr().out
    assert "WARNING: live steps at B~127, k=3 carry 592 prefill tokens per step" in printed
    assert len(json.loads(out.read_text())["shape_warnings"]) == 1


@pytest.mark.parametrize("bad", ["3:127", "x:1:2", "3:0:10", "3:1:2:4", "-1:4:4"])
def test_compare_refuses_a_malformed_live_shape(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tabletune.cli.main import main

    with pytest.raises(SystemExit) as stop:  # argparse's one-line exit
        main(["compare", "--profile", str(OLD_PROFILES[1]), f"--live-shape={bad}"])
    assert stop.value.code == 2
    assert "argument --live-shape: expected K:BATCH:TOKENS" in capsys.readouterr().err
