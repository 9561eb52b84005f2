"""``tabletune check``: before trusting any table, is the engine itself sane?

At a few batch sizes, with every guess rejected (each step emits one token per request), it
times: every k through a one-range table (one launch with a starting table holding 0..K), the
best fixed k without a table (a second launch: the k with the best goodput B * tau(k) / T at
most batch sizes, under the given acceptance), and no speculation (a third). Two findings warn
loudly: setting a table makes serving slower than the same k without one (vLLM's V1 runner
drops full CUDA graphs to piecewise as soon as a table is set: 30-43 % on an H100), and k=0
costs more than no speculation (EAGLE-style drafters still run at k=0). It also says, per k,
where B * (k + 1) leaves the engine's CUDA-graph capture range (max_cudagraph_capture_size,
from the launch's log) and, with --capture-size N, what raising it to N would take.

Writes the step times and findings as JSON (--output, default engine-check.json); the three
launches' vLLM logs go to --logs, by default a new temporary folder (said at the start and the
end), so a check leaves nothing in the working folder but its JSON.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tabletune.errors import InputError
from tabletune.profiler.cudagraphs import (
    CaptureConfig,
    CaptureCost,
    GraphDispatch,
    capture_config_from_args,
    capture_config_from_log,
    capture_cost_from_log,
)
from tabletune.profiler.engine import EngineHttp
from tabletune.profiler.hook_protocol import SamplerMode
from tabletune.profiler.measure import TimingMeasurer
from tabletune.profiler.progress import Reporter
from tabletune.profiler.server import EngineSpec, starting_table
from tabletune.profiler.session import EngineSession
from tabletune.profiler.settings import ProfilerSettings

DEFAULT_THRESHOLD = 0.03
"""a difference above 3 % is a finding, below it is noise"""
ASSUMED_RATES = (0.75, 0.55, 0.40)
"""typical EAGLE-3 acceptance (docs/design.md), assumed when none is given"""

ArmOpener = Callable[[EngineSpec, str], AbstractContextManager[EngineHttp]]
"""(spec, arm name) -> a context giving an engine running that spec"""
LogReader = Callable[[str], str]
"""arm name -> the text of its vLLM log ('' when there is none)"""


def assumed_rates(num_speculative_tokens: int) -> tuple[float, ...]:
    """ASSUMED_RATES for K <= 3; beyond, each position keeps 73 % of the one before."""
    rates = list(ASSUMED_RATES[:num_speculative_tokens])
    while len(rates) < num_speculative_tokens:
        rates.append(rates[-1] * 0.73)
    return tuple(rates)


@dataclass(frozen=True)
class CheckRequest:
    model: str
    num_speculative_tokens: int
    max_num_seqs: int
    drafter: str | None = None
    method: str = "eagle3"
    k: int | None = None
    """the fixed k launched without a table (default: the best fixed k measured)"""
    batch_sizes: tuple[int, ...] = ()
    """default: 1, max_num_seqs / 4, max_num_seqs"""
    threshold: float = DEFAULT_THRESHOLD
    rates: tuple[float, ...] | None = None
    """acceptance a_1..a_K for the best fixed k (default: ASSUMED_RATES)"""
    capture_size: int | None = None
    """say what raising max_cudagraph_capture_size to this would take"""

    def __post_init__(self) -> None:
        k = self.k
        if k is not None and not 1 <= k <= self.num_speculative_tokens:
            raise InputError(f"check: k={k} must be in 1..K={self.num_speculative_tokens}")
        if self.rates is not None and len(self.rates) != self.num_speculative_tokens:
            raise InputError(
                f"check: expected K={self.num_speculative_tokens} acceptance rates, "
                f"got {len(self.rates)}"
            )

    @property
    def acceptance(self) -> tuple[float, ...]:
        return self.rates or assumed_rates(self.num_speculative_tokens)

    def batches(self) -> tuple[int, ...]:
        chosen = self.batch_sizes or (1, max(1, self.max_num_seqs // 4), self.max_num_seqs)
        return tuple(sorted({b for b in chosen if 1 <= b <= self.max_num_seqs}))


def tau(rates: Sequence[float], k: int) -> float:
    return 1.0 + sum(rates[:k])


def best_fixed_k(
    table_ms: dict[int, dict[int, float]], rates: Sequence[float], batches: Sequence[int]
) -> dict[int, int]:
    """Per B, the k with the highest goodput B * tau(k) / T(B, k) (``table_ms``: k -> B -> ms)."""
    return {b: max(sorted(table_ms), key=lambda k: tau(rates, k) / table_ms[k][b]) for b in batches}


def static_k(
    best: dict[int, int], table_ms: dict[int, dict[int, float]], rates: Sequence[float]
) -> int:
    """The one k >= 1 to launch without a table: best at the most batch sizes, ties broken by
    total goodput (a static launch needs k >= 1; where k=0 is best, the no-speculation launch
    is its comparison)."""
    ks = [k for k in table_ms if k >= 1]
    wins = {k: sum(1 for b_k in best.values() if b_k == k) for k in ks}
    return max(ks, key=lambda k: (wins[k], sum(tau(rates, k) / table_ms[k][b] for b in best)))


@dataclass
class CheckResult:
    batch_sizes: tuple[int, ...]
    step_ms: dict[str, dict[int, float]] = field(default_factory=dict)
    """arm -> B -> median step ms"""
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rates: tuple[float, ...] = ()
    rates_assumed: bool = True
    best_fixed_k: dict[int, int] = field(default_factory=dict)
    static_k: int | None = None
    capture: dict[str, Any] = field(default_factory=dict)

    def tokens_per_s(self, arm: str, batch: int) -> float:
        """Every guess rejected: one token per request per step."""
        return batch * 1000.0 / self.step_ms[arm][batch]

    def table_ms(self) -> dict[int, dict[int, float]]:
        """k -> B -> ms of the arms timed through a table."""
        return {
            int(arm.removeprefix("table_k")): row
            for arm, row in self.step_ms.items()
            if arm.startswith("table_k")
        }

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
            "acceptance": {"rates": list(self.rates), "assumed": self.rates_assumed},
            "best_fixed_k": {str(b): k for b, k in self.best_fixed_k.items()},
            "static_k": self.static_k,
            "capture": self.capture,
            "warnings": self.warnings,
            "notes": self.notes,
        }


def findings(result: CheckResult, *, fixed_k: int, threshold: float) -> list[str]:
    """The loud warnings (pure: from the measured steps)."""
    out = []
    static, table = (
        result.step_ms.get(f"static_k{fixed_k}"),
        result.step_ms.get(f"table_k{fixed_k}"),
    )
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


def fixed_k_notes(result: CheckResult, num_speculative_tokens: int) -> list[str]:
    """Per B: the best fixed k, and what K (a static launch's usual choice) loses to it."""
    table = result.table_ms()
    big_k = num_speculative_tokens
    notes = []
    for b, best in result.best_fixed_k.items():
        loss = 1.0 - (tau(result.rates, big_k) / table[big_k][b]) / (
            tau(result.rates, best) / table[best][b]
        )
        notes.append(
            f"B={b}: best fixed k={best}"
            + (f"; K={big_k} loses {loss:.0%} of its goodput" if best != big_k else "")
        )
    return notes


def capture_report(
    dispatch: GraphDispatch,
    *,
    ks: Sequence[int],
    max_num_seqs: int,
    cost: CaptureCost | None,
    raised: GraphDispatch | None,
    wanted: int | None,
) -> tuple[dict[str, Any], list[str]]:
    """Where each k leaves the capture range, the batch sizes without a full graph, and what
    raising the limit would take (pure)."""
    limit = dispatch.capture.max_capture_size
    per_k = {}
    notes = []
    for k in ks:
        beyond = dispatch.first_batch_beyond(k)
        off = [b for b in range(1, max_num_seqs + 1) if dispatch.decode_step(b, k).mode != "full"]
        within = [b for b in off if b < beyond]
        per_k[str(k)] = {
            "first_batch_beyond": beyond if beyond <= max_num_seqs else None,
            "batches_without_full_graph_below_it": within,
        }
        if beyond <= max_num_seqs:
            notes.append(
                f"k={k}: B*(k+1) leaves the CUDA-graph capture range ({limit} tokens) from "
                f"B={beyond}: steps there run without a graph (several times slower)"
            )
        if within:
            notes.append(
                f"k={k}: {len(within)} batch size(s) below that run without a full graph "
                f"(bucket rounding): {within[:12]}{' ...' if len(within) > 12 else ''}"
            )
    report: dict[str, Any] = {
        "max_capture_size": limit,
        "source": dispatch.capture.source,
        "graphs": dispatch.graph_count,
        "per_k": per_k,
    }
    if cost is not None:
        report["captured_in_s"] = cost.seconds
        report["captured_gib"] = cost.gib
    if raised is not None:
        raise_to = raised.capture
        extra = raised.graph_count - dispatch.graph_count
        plan: dict[str, Any] = {
            "max_capture_size": raise_to.max_capture_size,
            "graphs": raised.graph_count,
            "extra_graphs": extra,
            "first_batch_beyond": {
                str(k): (b if (b := raised.first_batch_beyond(k)) <= max_num_seqs else None)
                for k in ks
            },
            "compilation_config": {"max_cudagraph_capture_size": raise_to.max_capture_size},
        }
        line = (
            f"raising max_cudagraph_capture_size to {raise_to.max_capture_size} "
            f'(--compilation-config \'{{"max_cudagraph_capture_size": '
            f"{raise_to.max_capture_size}}}') captures {extra} more graphs"
        )
        if cost is not None and dispatch.graph_count:
            seconds = cost.seconds * extra / dispatch.graph_count
            gib = cost.gib * raise_to.max_capture_size / max(limit, 1)
            plan["estimated_extra_startup_s"] = round(seconds, 1)
            plan["estimated_graph_memory_gib"] = round(gib, 2)
            line += (
                f": about {seconds:.0f} s more start-up and {gib:.1f} GiB of graph memory "
                f"(now {cost.seconds:.0f} s, {cost.gib:.2f} GiB; estimates, scaled from this "
                "launch's log: measure with bench/gpu/capture_size.sh)"
            )
        else:
            line += " (start-up and memory: no 'Graph capturing finished' line in the log)"
        if wanted is not None and raise_to.max_capture_size != wanted:
            line += (
                f" ({wanted} asked; vLLM keeps the largest capture size up to it and "
                "max_num_batched_tokens)"
            )
        report["raise"] = plan
        notes.append(line)
    return report, notes


class EngineCheck:
    def __init__(
        self,
        request: CheckRequest,
        *,
        settings: ProfilerSettings,
        reporter: Reporter,
        open_arm: ArmOpener,
        read_log: LogReader = lambda arm: "",
    ) -> None:
        self.request = request
        self.settings = settings
        self.reporter = reporter
        self._open = open_arm
        self._read_log = read_log

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

    def _capture(self, ks: Sequence[int]) -> tuple[dict[str, Any], list[str]]:
        r = self.request
        log = self._read_log("table")
        config = capture_config_from_log(log) or capture_config_from_args(
            self.settings.launch.extra_args,
            max_num_seqs=r.max_num_seqs,
            num_speculative_tokens=r.num_speculative_tokens,
        )

        def dispatch(capture: CaptureConfig) -> GraphDispatch:
            return GraphDispatch(
                capture,
                max_num_seqs=r.max_num_seqs,
                num_speculative_tokens=r.num_speculative_tokens,
                table_ks=list(ks),
            )

        raised = None
        if r.capture_size is not None:
            asked = json.dumps({"max_cudagraph_capture_size": r.capture_size})
            raised = dispatch(
                capture_config_from_args(
                    [*self.settings.launch.extra_args, "--compilation-config", asked],
                    max_num_seqs=r.max_num_seqs,
                    num_speculative_tokens=r.num_speculative_tokens,
                )
            )
        return capture_report(
            dispatch(config),
            ks=ks,
            max_num_seqs=r.max_num_seqs,
            cost=capture_cost_from_log(log),
            raised=raised,
            wanted=r.capture_size,
        )

    def run(self) -> CheckResult:
        r = self.request
        ks = tuple(range(r.num_speculative_tokens + 1))
        result = CheckResult(
            batch_sizes=r.batches(), rates=r.acceptance, rates_assumed=r.rates is None
        )
        base = EngineSpec(
            model=r.model,
            max_num_seqs=r.max_num_seqs,
            drafter=r.drafter,
            method=r.method,
            num_speculative_tokens=r.num_speculative_tokens,
            sampler=SamplerMode.rejecting_all(r.num_speculative_tokens),
        )
        self.reporter.phase("engine check", (len(ks) + 2) * len(result.batch_sizes))
        table_spec = replace(base, starting_table=starting_table(ks, r.max_num_seqs))
        with self._open(table_spec, "table") as engine:
            for k in ks:
                engine.set_k_everywhere(k, r.max_num_seqs)
                self._measure(engine, f"table_k{k}", result)
        result.best_fixed_k = best_fixed_k(result.table_ms(), result.rates, result.batch_sizes)
        k = r.k or static_k(result.best_fixed_k, result.table_ms(), result.rates)
        result.static_k = k
        static = replace(base, num_speculative_tokens=k, sampler=SamplerMode.rejecting_all(k))
        with self._open(static, "static") as engine:
            self._measure(engine, f"static_k{k}", result)
        with self._open(replace(base, num_speculative_tokens=0, sampler=None), "no_spec") as engine:
            self._measure(engine, "no_spec", result)
        self.reporter.done()
        result.warnings = findings(result, fixed_k=k, threshold=r.threshold)
        result.capture, capture_notes = self._capture(ks)
        assumed = " (assumed acceptance: give --acceptance)" if result.rates_assumed else ""
        result.notes = [
            *(note + assumed for note in fixed_k_notes(result, r.num_speculative_tokens)),
            *capture_notes,
        ]
        for warning in result.warnings:
            self.reporter.note(f"[bold red]WARNING[/]: {warning}")
        for note in result.notes:
            self.reporter.note(f"[yellow]note[/]: {note}")
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


def arm_logs(log_dir: Path) -> LogReader:
    """The log of each arm's launch under ``log_dir`` (as ``launching_arms`` writes them)."""

    def read(arm: str) -> str:
        try:
            return (log_dir / arm / "vllm-1.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    return read


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
