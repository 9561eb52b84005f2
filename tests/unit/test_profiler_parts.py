"""Counters, prompts, the sampler-switch protocol and the engine hook (with a stand-in worker)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from tabletune.errors import InputError
from tabletune.profiler.acceptance import rates_from_counters
from tabletune.profiler.errors import MeasurementError
from tabletune.profiler.hook_protocol import HOOK_METHOD, SamplerMode, conditional_rates
from tabletune.profiler.measure import check_k_applied
from tabletune.profiler.metrics import SpecCounters, parse_spec_counters
from tabletune.profiler.prompts import TokenPrompts, load_prompt_set

VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 60.0
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 180.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 170.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 102.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 75.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 55.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 45.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 33.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="2"} 24.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
"""


def test_vllm_counters_are_summed_over_engines_by_position() -> None:
    counters = parse_spec_counters(VLLM_METRICS)
    assert counters == SpecCounters(
        drafts=160.0,
        draft_tokens=480.0,
        accepted_tokens=272.0,
        accepted_per_pos=(120.0, 88.0, 64.0),
    )
    assert parse_spec_counters("") == SpecCounters()


def test_acceptance_is_accepted_per_position_over_drafts() -> None:
    later = parse_spec_counters(VLLM_METRICS)
    earlier = SpecCounters(drafts=60, draft_tokens=180, accepted_per_pos=(45, 33, 24))
    delta = later.minus(earlier)
    assert rates_from_counters(delta, 3) == pytest.approx((0.75, 0.55, 0.40))
    with pytest.raises(MeasurementError, match="no drafts"):
        rates_from_counters(SpecCounters(), 3)
    mixed = SpecCounters(drafts=10, draft_tokens=25, accepted_per_pos=(5, 2, 1))
    with pytest.raises(MeasurementError, match="not K=3"):
        rates_from_counters(mixed, 3)


def test_timing_counters_must_show_exactly_k_and_nothing_accepted() -> None:
    check_k_applied(SpecCounters(drafts=10, draft_tokens=20), 2)
    check_k_applied(SpecCounters(), 0)
    with pytest.raises(MeasurementError, match="did not take effect"):
        check_k_applied(SpecCounters(drafts=10, draft_tokens=30), 2)
    with pytest.raises(MeasurementError, match="did not take effect"):
        check_k_applied(SpecCounters(drafts=10, draft_tokens=30), 0)
    with pytest.raises(MeasurementError, match="no drafts"):
        check_k_applied(SpecCounters(), 1)
    with pytest.raises(MeasurementError, match="not in timing mode"):
        check_k_applied(SpecCounters(drafts=10, draft_tokens=10, accepted_tokens=1), 1)


def test_timing_prompts_are_fresh_and_reproducible() -> None:
    a = TokenPrompts(length=32, low=1000, high=30000, seed=7)
    b = TokenPrompts(length=32, low=1000, high=30000, seed=7)
    first = a.take(4)
    assert first == b.take(4)
    assert all(len(p) == 32 and all(1000 <= t < 30000 for t in p) for p in first)
    assert len({tuple(p) for p in first + a.take(4)}) == 8


def test_prompt_sets_from_jsonl(tmp_path: Path) -> None:
    text = tmp_path / "text.jsonl"
    text.write_text('{"prompt": "hello"}\n\n"bare"\n{"prompt": "third"}\n')
    assert load_prompt_set(text, limit=2) == ["hello", "bare"]
    ids = tmp_path / "ids.jsonl"
    ids.write_text('{"prompt_token_ids": [1, 2, 3]}\n[4, 5]\n')
    assert load_prompt_set(ids, limit=10) == [[1, 2, 3], [4, 5]]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt_token_ids": [1, -2]}\n')
    with pytest.raises(InputError, match=r"bad\.jsonl:2"):
        load_prompt_set(bad, limit=10)
    with pytest.raises(InputError, match="cannot read"):
        load_prompt_set(tmp_path / "missing.jsonl", limit=1)


def test_sampler_modes_validate_and_round_trip() -> None:
    mode = SamplerMode("synthetic", (0.75, 0.55, 0.40))
    assert SamplerMode.from_json(json.loads(json.dumps(mode.to_json()))) == mode
    assert SamplerMode.rejecting_all(3).speculative_config() == {
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": [0.0, 0.0, 0.0],
    }
    assert SamplerMode("standard").speculative_config() == {"rejection_sample_method": "standard"}
    for bad in ((0.5, 0.6), (1.2,), ()):
        with pytest.raises(InputError):
            SamplerMode("synthetic", bad)
    with pytest.raises(InputError):
        SamplerMode.from_json({"kind": "greedy"})


def test_conditional_rates_match_vllms_conversion() -> None:
    # vllm.v1.spec_decode.utils.unconditional_to_conditional_rates: c_i = p_i / p_{i-1}
    assert conditional_rates((0.75, 0.55, 0.40)) == pytest.approx([0.75, 0.55 / 0.75, 0.40 / 0.55])
    assert conditional_rates((0.0, 0.0)) == [0.0, 0.0]


class FakeTensor:
    def __init__(self, values: list[float], **kwargs: Any) -> None:
        self.values = values
        self.kwargs = kwargs


class FakeSampler:
    def __init__(self) -> None:
        self.num_speculative_steps = 3
        self.synthetic_conditional_rates: FakeTensor | None = None
        self.synthetic_mode = False


class FakeWorker:
    def __init__(self) -> None:
        self.device = "cuda:0"
        self.model_runner = types.SimpleNamespace(rejection_sampler=FakeSampler())


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> type:
    """Just enough of vllm and torch for the hook: a Worker class and torch.tensor."""
    worker_class = type("Worker", (), {})
    modules = {
        "vllm": types.SimpleNamespace(__version__="0.26.0"),
        "vllm.v1": types.ModuleType("vllm.v1"),
        "vllm.v1.worker": types.ModuleType("vllm.v1.worker"),
        "vllm.v1.worker.gpu_worker": types.SimpleNamespace(Worker=worker_class),
        "torch": types.SimpleNamespace(tensor=FakeTensor, float32="float32"),
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return worker_class


def test_the_hook_adds_a_worker_method_that_swaps_the_rates(fake_vllm: type) -> None:
    from tabletune.profiler import engine_hook

    engine_hook.register()
    method = getattr(fake_vllm, HOOK_METHOD)
    worker = FakeWorker()
    sampler = worker.model_runner.rejection_sampler
    answer = method(worker, json.dumps(SamplerMode("synthetic", (0.75, 0.55, 0.40)).to_json()))
    assert answer == {"kind": "synthetic", "rates": [0.75, 0.55, 0.40]}
    assert sampler.synthetic_conditional_rates.values == pytest.approx(
        [0.75, 0.55 / 0.75, 0.40 / 0.55]
    )
    assert sampler.synthetic_conditional_rates.kwargs["device"] == "cuda:0"
    assert sampler.synthetic_mode is True
    method(worker, json.dumps({"kind": "standard", "rates": []}))
    assert sampler.synthetic_conditional_rates is None and sampler.synthetic_mode is False
    with pytest.raises(ValueError, match="need 3 rates"):
        method(worker, json.dumps({"kind": "synthetic", "rates": [0.5]}))


def test_the_hook_stays_out_of_other_vllm_versions(fake_vllm: type) -> None:
    from tabletune.profiler import engine_hook

    sys.modules["vllm"].__version__ = "0.27.0"  # type: ignore[attr-defined]
    engine_hook.register()
    assert not hasattr(fake_vllm, HOOK_METHOD)
