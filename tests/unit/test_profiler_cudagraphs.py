"""vLLM 0.26's capture sizes and the V2 runner's graph choice per (B, k), against the source's rule
and against the H200 profile whose slow cells it explains."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.errors import InputError
from tabletune.profiler.cudagraphs import (
    CaptureConfig,
    CaptureCost,
    GraphDispatch,
    capture_config_from_log,
    capture_cost_from_log,
    capture_sizes_up_to,
    default_max_capture_size,
)
from tabletune.schemas import load_profile

H200 = Path(__file__).resolve().parents[2] / "profiles" / "h200-qwen3-4b-eagle3.json"
PROFILER_TABLE_KS = [3, 2, 1, 0]  # the profiler's starting table [[1,1,3],[2,2,2],[3,3,1],[4,N,0]]


def h200_dispatch() -> GraphDispatch:
    capture = CaptureConfig.default(max_num_seqs=256, num_speculative_tokens=3)
    return GraphDispatch(
        capture, max_num_seqs=256, num_speculative_tokens=3, table_ks=PROFILER_TABLE_KS
    )


def test_default_capture_sizes_follow_vllm_026() -> None:
    assert default_max_capture_size(256, 3) == 512
    assert default_max_capture_size(16, 1) == 64
    assert default_max_capture_size(256, 3, max_num_batched_tokens=300) == 300
    sizes = capture_sizes_up_to(512)
    assert sizes[:4] == (1, 2, 4, 8)
    assert sizes == (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))
    assert capture_sizes_up_to(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert capture_sizes_up_to(3) == (1, 2)
    assert capture_sizes_up_to(300, max_num_batched_tokens=300)[-3:] == (272, 288, 300)
    assert (
        CaptureConfig.default(
            max_num_seqs=256, num_speculative_tokens=3, max_num_batched_tokens=300
        ).capture_sizes[-1]
        == 300
    )
    # A limit off the grid is truncated to the largest size on it, as vLLM does.
    assert (
        CaptureConfig.default(
            max_num_seqs=256, num_speculative_tokens=3, max_capture_size=1000
        ).max_capture_size
        == 992
    )
    with pytest.raises(InputError):
        capture_sizes_up_to(0)


def test_the_h200_profiles_slow_cells_are_the_ones_without_a_full_graph() -> None:
    """Every cell of the committed H200 profile (46 B x k=0..3, measured) that the dispatch model
    sends to eager or piecewise is slower than the full-graph cells around it, and the eager
    ones by far: the 25-45 ms k=0 cells at B=3, 5, 6, 9 run eager."""
    profile = load_profile(H200)
    dispatch = h200_dispatch()
    modes = {
        (c.batch_size, c.k): dispatch.decode_step(c.batch_size, c.k).mode for c in profile.cells
    }
    step = {(c.batch_size, c.k): c.step_ms for c in profile.cells}
    assert sorted(b for (b, k), m in modes.items() if k == 0 and m != "full") == [3, 5, 6, 9]
    assert sorted(b for (b, k), m in modes.items() if k == 1 and m != "full") == [3, 9]
    assert [b for (b, k), m in sorted(modes.items()) if k == 2 and m == "piecewise"] == [
        4, 5, 9, 10, 12, 13, 88, 104, 120, 136, 152, 168
    ]  # fmt: skip
    assert min(b for (b, k), m in modes.items() if k == 2 and m == "eager") == 176
    assert min(b for (b, k), m in modes.items() if k == 3 and m != "full") == 136
    for (b, k), mode in modes.items():
        near = [
            step[(bb, k)]
            for bb in profile.batch_grid
            if abs(bb - b) <= 16 and bb != b and modes[(bb, k)] == "full"
        ]
        if not near:
            continue  # past the capture limit every neighbour runs eager too
        peers = statistics.median(near)
        if mode == "eager":
            assert step[(b, k)] > 2.5 * peers, (b, k)
        if mode == "piecewise":
            assert step[(b, k)] > 1.2 * peers, (b, k)
        if mode == "full":
            assert step[(b, k)] < 2.0 * peers, (b, k)  # and no full-graph cell jumps like them


def test_capture_limit_and_notes() -> None:
    dispatch = h200_dispatch()
    assert [dispatch.first_batch_beyond(k) for k in range(4)] == [513, 257, 171, 129]
    assert dispatch.decode_step(128, 3).mode == "full"
    assert dispatch.decode_step(129, 3) == dispatch.decode_step(129, 3)
    beyond = dispatch.decode_step(129, 3)
    assert (beyond.mode, beyond.bucket, beyond.tokens) == ("eager", None, 516)
    assert "exceed max_cudagraph_capture_size 512" in dispatch.note(129, 3)
    assert "3-token bucket" in dispatch.note(3, 0) and "no CUDA graph" in dispatch.note(3, 0)
    assert "piecewise CUDA graph only" in dispatch.note(4, 2)
    assert dispatch.note(8, 0) == ""
    padded = dispatch.decode_step(3, 3)  # 12 tokens run the 16-token graph of 4 requests
    assert (padded.mode, padded.tokens) == ("full", 16)


def test_a_static_k_has_one_query_length() -> None:
    capture = CaptureConfig.default(max_num_seqs=256, num_speculative_tokens=3)
    static = GraphDispatch(capture, max_num_seqs=256, num_speculative_tokens=3, table_ks=None)
    assert all(static.decode_step(b, 3).mode == "full" for b in range(1, 129))
    assert static.decode_step(3, 0).mode == "piecewise"  # only K's graphs are captured full


LOG = """\
INFO 11-30 04:01:12 [core.py:98] Initializing a V1 LLM engine (v0.26.0) with config: \
model='/tmp/models/qwen3-4b', ..., compilation_config={'mode': <CompilationMode.VLLM_COMPILE: \
3>, 'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, 'cudagraph_capture_sizes': \
[1, 2, 4, 8, 16, 24], 'max_cudagraph_capture_size': 24, 'local_cache_dir': None}
INFO 11-30 04:02:40 [gpu_model_runner.py:748] Graph capturing finished in 12 secs, took 0.61 GiB
INFO 11-30 04:02:41 [gpu_model_runner.py:748] Graph capturing finished in 3 secs, took 0.20 GiB
"""


def test_the_engine_log_gives_the_capture_sizes_and_their_cost() -> None:
    assert capture_config_from_log(LOG) == CaptureConfig(24, (1, 2, 4, 8, 16, 24), "engine log")
    assert capture_config_from_log("no config here") is None
    assert capture_cost_from_log(LOG) == CaptureCost(3.0, 0.2)
    assert capture_cost_from_log("") is None


@given(
    max_num_seqs=st.integers(1, 512),
    big_k=st.integers(1, 6),
    batch=st.integers(1, 512),
    k=st.integers(0, 6),
    ks=st.lists(st.integers(0, 6), min_size=1, max_size=5),
)
def test_dispatch_invariants(
    max_num_seqs: int, big_k: int, batch: int, k: int, ks: list[int]
) -> None:
    k = min(k, big_k)
    ks = [min(x, big_k) for x in ks]
    capture = CaptureConfig.default(max_num_seqs=max_num_seqs, num_speculative_tokens=big_k)
    dispatch = GraphDispatch(
        capture, max_num_seqs=max_num_seqs, num_speculative_tokens=big_k, table_ks=ks
    )
    step = dispatch.decode_step(batch, k)
    tokens = batch * (k + 1)
    assert step.tokens >= tokens
    if tokens > capture.max_capture_size:
        assert step.mode == "eager" and step.bucket is None
    if step.mode != "eager":
        assert step.bucket is not None and tokens <= step.tokens <= step.bucket
    if step.mode == "full":
        assert step.tokens % (k + 1) == 0 and step.tokens // (k + 1) >= batch
        assert k in ks
    assert (dispatch.note(batch, k) == "") == (step.mode == "full")
