"""``tabletune check``: before trusting any table, is the engine itself sane?

At a few batch sizes, with every guess rejected (so each step emits one token per request), it
measures the step of: the best fixed k without a table (static K), the same k through a
one-range table, k=0 through a table, and no speculation at all. Two findings warn loudly:
setting a table makes serving slower (vLLM's V1 runner drops full CUDA graphs to piecewise as
soon as a table is set: 30-43 % on an H100), and k=0 costs more than no speculation (EAGLE-style
drafters still run at k=0). Three launches: static K, with a table, without speculation.

Writes the step times and findings as JSON (--output, default engine-check.json); the three
launches' vLLM logs go to --logs, by default a new temporary folder (said at the start and the
end), so a check leaves nothing in the working folder but its JSON.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tabletune.errors import InputError
from tabletune.profiler.engine import EngineHttp
from tabletune.profiler.hook_protocol import SamplerMode
from tabletune.profiler.measure import TimingMeasurer
from tabletune.profiler.progress import Reporter
from tabletune.profiler.server import EngineSpec, starting_table
from tabletune.profiler.session import EngineSession
from tabletune.profiler.settings import ProfilerSettings

DEFAULT_THRESHOLD = 0.03
"""a difference above 3 % is a finding, below it is noise"""

ArmOpener = Callable[[EngineSpec, str], AbstractContextManager[EngineHttp]]
"""(spec, arm name) -> a context giving an engine running that spec"""


@dataclass(frozen=True)
class CheckRequest:
    model: str
    num_speculative_tokens: int
    max_num_seqs: int
    drafter: str | None = None
    method: str = "eagle3"
    k: int | None = None
    """the fixed k to compare (default K)"""
    batch_sizes: tuple[int, ...] = ()
    """default: 1, max_num_seqs / 4, max_num_seqs"""
    threshold: float = DEFAULT_THRESHOLD

    @property
    def fixed_k(self) -> int:
        k = self.num_speculative_tokens if self.k is None else self.k
        if not 1 <= k <= self.num_speculative_tokens:
            raise InputError(f"check: k={k} must be in 1..K={self.num_speculative_tokens}")
        return k

    def batches(self) -> tuple[int, ...]:
        chosen = self.batch_sizes or (1, max(1, self.max_num_seqs // 4), self.max_num_seqs)
        return tuple(sorted({b for b in chosen if 1 <= b <= self.max_num_seqs}))


@dataclass
class CheckResult:
    batch_sizes: tuple[int, ...]
    step_ms: dict[str, dict[int, float]] = field(default_factory=dict)
    """arm -> B -> median step ms"""
    warnings: list[str] = field(default_factory=list)

    def tokens_per_s(self, arm: str, batch: int) -> float:
        """Every guess rejected: one token per request per step."""
        return batch * 1000.0 / self.step_ms[arm][batch]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "tabletune.engine-check",
            "batch_sizes": list(self.batch_sizes),
            "step_ms": {
                arm: {str(b): round(v, 3) for b, v in row.items()}
                for arm, row in self.step_ms.items()
            },
            "tokens_per_s": {
                arm: {str(b): round(self.tokens_per_s(arm, b), 1) for b in row}
                for arm, row in self.step_ms.items()
            },
            "warnings": self.warnings,
        }


def findings(result: CheckResult, *, fixed_k: int, threshold: float) -> list[str]:
    """The loud warnings (pure: from the measured steps)."""
    out = []
    static, table = result.step_ms.get("static"), result.step_ms.get("table")
    if static and table:
        worst = max(result.batch_sizes, key=lambda b: table[b] / static[b])
        slower = table[worst] / static[worst] - 1.0
        if slower > threshold:
            out.append(
                f"SETTING A TABLE MAKES SERVING SLOWER: k={fixed_k} through a table is "
                f"{slower:.0%} slower than the same k without one (B={worst}). vLLM's V1 runner "
                "drops full CUDA graphs to piecewise when a table is set; use the V2 runner "
                "(VLLM_USE_V2_MODEL_RUNNER=1) or serve without a table."
            )
    k0, none = result.step_ms.get("table_k0"), result.step_ms.get("no_spec")
    if k0 and none:
        worst = max(result.batch_sizes, key=lambda b: k0[b] / none[b])
        costlier = k0[worst] / none[worst] - 1.0
        if costlier > threshold:
            out.append(
                f"k=0 IS NOT OFF: a step at k=0 costs {costlier:.0%} more than no speculation "
                f"(B={worst}); the drafter still runs (EAGLE-style). Where the table says 0, "
                "serving pays for a drafter it does not use."
            )
    return out


class EngineCheck:
    def __init__(
        self,
        request: CheckRequest,
        *,
        settings: ProfilerSettings,
        reporter: Reporter,
        open_arm: ArmOpener,
    ) -> None:
        self.request = request
        self.settings = settings
        self.reporter = reporter
        self._open = open_arm

    def _measure(self, engine: EngineHttp, arm: str, result: CheckResult) -> None:
        measurer = TimingMeasurer(
            engine,
            settings=self.settings.timing,
            max_num_seqs=self.request.max_num_seqs,
            temperature=0.0,
            reporter=self.reporter,
            on_sample=lambda sample: None,
        )
        measurer.warm_up()
        row = {}
        for b in result.batch_sizes:
            row[b] = statistics.median(measurer.cell(b, 0))
            self.reporter.advance(f"{arm} B={b}")
        result.step_ms[arm] = row

    def run(self) -> CheckResult:
        r = self.request
        k = r.fixed_k
        result = CheckResult(batch_sizes=r.batches())
        rejecting = SamplerMode.rejecting_all(r.num_speculative_tokens)
        base = EngineSpec(
            model=r.model,
            max_num_seqs=r.max_num_seqs,
            drafter=r.drafter,
            method=r.method,
            num_speculative_tokens=r.num_speculative_tokens,
            sampler=rejecting,
        )
        self.reporter.phase("engine check", 4 * len(result.batch_sizes))
        static = replace(base, num_speculative_tokens=k, sampler=SamplerMode.rejecting_all(k))
        with self._open(static, "static") as engine:
            self._measure(engine, "static", result)
        table_spec = replace(base, starting_table=starting_table((k, 0), r.max_num_seqs))
        with self._open(table_spec, "table") as engine:
            engine.set_k_everywhere(k, r.max_num_seqs)
            self._measure(engine, "table", result)
            engine.set_k_everywhere(0, r.max_num_seqs)
            self._measure(engine, "table_k0", result)
        with self._open(replace(base, num_speculative_tokens=0, sampler=None), "no_spec") as engine:
            self._measure(engine, "no_spec", result)
        self.reporter.done()
        result.warnings = findings(result, fixed_k=k, threshold=r.threshold)
        for warning in result.warnings:
            self.reporter.note(f"[bold red]WARNING[/]: {warning}")
        return result


def logs_folder(chosen: Path | None) -> Path:
    """Where the launches' vLLM logs go: ``chosen``, else a new temporary folder."""
    if chosen is not None:
        return chosen
    return Path(tempfile.mkdtemp(prefix="tabletune-check-"))


def launching_arms(settings: ProfilerSettings, log_dir: Path, reporter: Reporter) -> ArmOpener:
    """Each arm is its own vLLM launch (what a table or speculation changes is fixed at start)."""

    def open_arm(spec: EngineSpec, arm: str) -> AbstractContextManager[EngineHttp]:
        return _arm_session(spec, arm, settings, log_dir, reporter)

    return open_arm


class _arm_session(AbstractContextManager[EngineHttp]):
    def __init__(
        self,
        spec: EngineSpec,
        arm: str,
        settings: ProfilerSettings,
        log_dir: Path,
        reporter: Reporter,
    ) -> None:
        self._session = EngineSession(
            spec=spec,
            attach_url=None,
            launch=settings.launch,
            connection=settings.connection,
            log_dir=log_dir / arm,
            reporter=reporter,
        )
        self._spec = spec

    def __enter__(self) -> EngineHttp:
        mode = self._spec.sampler or SamplerMode("standard")
        return self._session.current(mode)

    def __exit__(self, *exc: object) -> None:
        self._session.close()


def write_check(result: CheckResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
