"""``tabletune check`` against fake engines (virtual time): the two loud warnings."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tabletune.profiler.check import (
    ArmOpener,
    CheckRequest,
    CheckResult,
    EngineCheck,
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
    assert set(result.step_ms) == {"static", "table", "table_k0", "no_spec"}
    assert result.step_ms["table"][16] == pytest.approx((5.32 + 1.2 + 0.532) * 1.35)
    assert result.step_ms["no_spec"][64] == pytest.approx(6.28)
    assert len(result.warnings) == 2
    assert "SETTING A TABLE MAKES SERVING SLOWER" in result.warnings[0]
    assert "35%" in result.warnings[0]
    assert "k=0 IS NOT OFF" in result.warnings[1]
    assert any("WARNING" in note for note in reporter.notes)
    # the launches: static K (no table), a table holding k and 0, no speculation
    assert [s.starting_table is None for s in opened] == [True, False, True]
    assert [s.num_speculative_tokens for s in opened] == [3, 3, 0]
    assert opened[1].starting_table == ((1, 1, 3), (2, 64, 0))
    path = tmp_path / "check.json"
    write_check(result, path)
    assert '"tokens_per_s"' in path.read_text()


def test_a_sane_engine_gets_no_warning() -> None:
    check = EngineCheck(
        REQUEST, settings=SETTINGS, reporter=QuietReporter(), open_arm=arms(0.0, 0.01, [])
    )
    assert check.run().warnings == []


def test_findings_use_the_worst_batch_size_and_the_threshold() -> None:
    result = CheckResult(batch_sizes=(1, 8))
    result.step_ms = {"static": {1: 10.0, 8: 10.0}, "table": {1: 10.2, 8: 10.5}}
    (warning,) = findings(result, fixed_k=3, threshold=0.03)
    assert "5% slower" in warning and "(B=8)" in warning
    assert findings(result, fixed_k=3, threshold=0.06) == []
