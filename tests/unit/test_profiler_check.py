"""``tabletune check`` against fake engines (virtual time): the two loud warnings."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from tabletune.errors import InputError
from tabletune.profiler.check import (
    ArmOpener,
    CheckRequest,
    CheckResult,
    EngineCheck,
    assumed_rates,
    findings,
    write_check,
)
from tabletune.profiler.engine import EngineHttp
from tabletune.profiler.progress import QuietReporter
from tabletune.profiler.server import EngineSpec
from tabletune.profiler.settings import ConnectionSettings, ProfilerSettings, TimingSettings
from tests.unit.test_profiler_fake_engine import FakeConfig, FakeEngine

SETTINGS = ProfilerSettings(timing=TimingSettings(warmup_batches=(1,), repeats=3))


def arms(table_penalty: float, k0_penalty: float, opened: list[EngineSpec]) -> ArmOpener:
    """Fakes whose step depends on the launch: a table slows every step by ``table_penalty``
    (the V1 runner's piecewise graphs), k=0 costs ``k0_penalty`` over no speculation."""

    @contextmanager
    def open_arm(spec: EngineSpec, arm: str) -> Iterator[EngineHttp]:
        opened.append(spec)
        with_table = spec.starting_table is not None

        def step(b: int, k: int) -> float:
            base = 5.0 + 0.02 * b
            if k < 0:
                return base
            ms = base * (1 + k0_penalty) + 0.4 * k
            return ms * (1 + table_penalty) if with_table else ms

        fake = FakeEngine(
            FakeConfig(
                step_ms=step,
                max_num_seqs=spec.max_num_seqs,
                num_speculative_tokens=max(spec.num_speculative_tokens, 1),
                starting_table=None
                if spec.starting_table is None
                else [list(r) for r in spec.starting_table],
                speculative=spec.speculative,
                sampler=spec.sampler or FakeConfig().sampler,
            )
        )
        with (
            fake.serve() as url,
            EngineHttp(url, settings=ConnectionSettings(), clock=fake.clock.now) as engine,
        ):
            yield engine

    return open_arm


REQUEST = CheckRequest(model="/m", drafter="/d", num_speculative_tokens=3, max_num_seqs=64)


def test_a_table_that_slows_serving_and_a_k0_that_costs_are_both_reported(tmp_path: Path) -> None:
    opened: list[EngineSpec] = []
    reporter = QuietReporter()
    check = EngineCheck(
        REQUEST, settings=SETTINGS, reporter=reporter, open_arm=arms(0.35, 0.10, opened)
    )
    result = check.run()
    assert result.batch_sizes == (1, 16, 64)
    assert set(result.step_ms) == {
        "table_k0",
        "table_k1",
        "table_k2",
        "table_k3",
        "static_k3",
        "no_spec",
    }
    assert result.step_ms["table_k3"][16] == pytest.approx((5.32 * 1.1 + 1.2) * 1.35)
    assert result.step_ms["no_spec"][64] == pytest.approx(6.28)
    # assumed acceptance 0.75/0.55/0.40: k=3 has the best goodput at every B here
    assert result.best_fixed_k == {1: 3, 16: 3, 64: 3} and result.static_k == 3
    assert len(result.warnings) == 2
    assert "SETTING A TABLE MAKES SERVING SLOWER" in result.warnings[0]
    assert "k=3 through a table is 35%" in result.warnings[0]
    assert "k=0 IS NOT OFF" in result.warnings[1]
    assert any("WARNING" in note for note in reporter.notes)
    # the launches: a table holding every k, the best fixed k without a table, no speculation
    assert [s.starting_table is None for s in opened] == [False, True, True]
    assert [s.num_speculative_tokens for s in opened] == [3, 3, 0]
    assert opened[0].starting_table == ((1, 1, 3), (2, 2, 2), (3, 3, 1), (4, 64, 0))
    path = tmp_path / "check.json"
    write_check(result, path)
    written = json.loads(path.read_text())
    assert written["static_k"] == 3 and written["acceptance"]["assumed"] is True
    assert "tokens_per_s" in written and written["best_fixed_k"] == {"1": 3, "16": 3, "64": 3}


def test_the_static_launch_runs_the_best_fixed_k_not_k() -> None:
    opened: list[EngineSpec] = []
    low_acceptance = replace(REQUEST, rates=(0.30, 0.05, 0.01))  # long drafts do not pay
    result = EngineCheck(
        low_acceptance, settings=SETTINGS, reporter=QuietReporter(), open_arm=arms(0.0, 0.0, opened)
    ).run()
    assert result.best_fixed_k == {1: 1, 16: 1, 64: 1} and result.static_k == 1
    assert opened[1].num_speculative_tokens == 1 and opened[1].starting_table is None
    assert result.warnings == []
    assert any("B=64: best fixed k=1; K=3 loses" in note for note in result.notes)
    assert not any("assumed acceptance" in note for note in result.notes)


def test_a_sane_engine_gets_no_warning() -> None:
    check = EngineCheck(
        REQUEST, settings=SETTINGS, reporter=QuietReporter(), open_arm=arms(0.0, 0.01, [])
    )
    assert check.run().warnings == []


def test_findings_use_the_worst_batch_size_and_the_threshold() -> None:
    result = CheckResult(batch_sizes=(1, 8))
    result.step_ms = {"static_k3": {1: 10.0, 8: 10.0}, "table_k3": {1: 10.2, 8: 10.5}}
    (warning,) = findings(result, fixed_k=3, threshold=0.03)
    assert "5% slower" in warning and "(B=8)" in warning
    assert findings(result, fixed_k=3, threshold=0.06) == []


LOG = (
    "Initializing a V1 LLM engine (v0.26.0) with config: compilation_config={"
    "'cudagraph_capture_sizes': [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, "
    "112, 120, 128], 'max_cudagraph_capture_size': 128}\n"
    "Graph capturing finished in 20 secs, took 0.80 GiB\n"
)


def test_the_capture_limit_per_k_and_what_raising_it_takes() -> None:
    request = replace(REQUEST, capture_size=256)
    check = EngineCheck(
        request,
        settings=SETTINGS,
        reporter=QuietReporter(),
        open_arm=arms(0.0, 0.0, []),
        read_log=lambda arm: LOG if arm == "table" else "",
    )
    result = check.run()
    capture = result.capture
    assert capture["max_capture_size"] == 128 and capture["source"] == "engine log"
    assert capture["captured_in_s"] == 20.0
    per_k = capture["per_k"]
    # B*(k+1) > 128 within max_num_seqs 64 only for k=2 (from B=43) and k=3 (from B=33)
    assert [per_k[str(k)]["first_batch_beyond"] for k in range(4)] == [None, None, 43, 33]
    assert per_k["0"]["batches_without_full_graph_below_it"][:4] == [3, 5, 6, 9]
    plan = capture["raise"]
    assert plan["max_capture_size"] == 256 and plan["extra_graphs"] > 0
    assert plan["first_batch_beyond"] == {"0": None, "1": None, "2": None, "3": None}
    assert plan["estimated_graph_memory_gib"] == pytest.approx(1.6)
    assert any(
        "k=3: B*(k+1) leaves the CUDA-graph capture range (128 tokens) from B=33" in n
        for n in result.notes
    )
    assert any(n.startswith("raising max_cudagraph_capture_size to 256") for n in result.notes)


def test_without_a_log_the_capture_sizes_follow_vllms_rule() -> None:
    result = EngineCheck(
        replace(REQUEST, capture_size=1000),
        settings=SETTINGS,
        reporter=QuietReporter(),
        open_arm=arms(0.0, 0.0, []),
    ).run()
    assert result.capture["max_capture_size"] == 512  # min(64 * 4 * 2, 512)
    assert "captured_in_s" not in result.capture
    assert result.capture["raise"]["max_capture_size"] == 992
    assert any("1000 asked" in n for n in result.notes)


def test_a_bad_request_is_refused_before_any_launch() -> None:
    with pytest.raises(InputError, match=r"k=4 must be in 1\.\.K=3"):
        replace(REQUEST, k=4)
    with pytest.raises(InputError, match="expected K=3 acceptance rates, got 2"):
        replace(REQUEST, rates=(0.5, 0.3))
    assert assumed_rates(5) == pytest.approx((0.75, 0.55, 0.40, 0.292, 0.21316))
