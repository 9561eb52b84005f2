"""Deterministic stand-ins for the daemon's unit tests: a fake clock, an engine whose counters
follow the goodput model exactly, and an admin client over the real ``TableState`` transitions.

The engine is the model itself (expected counts, no noise) so every number a test checks can be
derived by hand; the real emulator and real servers are exercised by the integration tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tabletune.admin.client import AdminRequest, StateAdminClient
from tabletune.admin.protocol import EngineIdentity, SettingsPut, TablePut, TableView
from tabletune.admin.state import TableState
from tabletune.daemon.counters import mean_batch_of
from tabletune.daemon.guard import GoodputHistory
from tabletune.daemon.loads import LoadTracker
from tabletune.daemon.observation import Observation, SourceResult
from tabletune.daemon.profiles import PoolProfile
from tabletune.daemon.runtime import ReplicaRuntime
from tabletune.daemon.state import ReplicaRecord
from tabletune.daemon.step_time import StepTimeEstimator, StepTimeLayout
from tabletune.errors import TemporaryError
from tabletune.schemas import Profile
from tabletune.schemas.acceptance import AcceptanceProfile
from tabletune.schemas.profile import Cell, ProfileMetadata
from tabletune.solver import StepTimes
from tabletune.step_cells import CellKey, CellTotals, cell_key


class FakeClock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def small_profile(*, prior: Sequence[float] = (0.8, 0.6, 0.45)) -> Profile:
    """A 3-k profile where longer drafts cost more at larger batches (so the table matters)."""
    grid = (1, 8, 16, 32, 64, 128)
    ks = (0, 1, 2, 3)
    base = {1: 5.0, 8: 5.5, 16: 6.0, 32: 7.5, 64: 11.0, 128: 20.0}
    cells = []
    for b in grid:
        for k in ks:
            ms = base[b] * (1.0 + k * 0.06 * b**0.5 / 2)
            cells.append(Cell(batch_size=b, k=k, samples_ms=(ms,), step_ms=ms))
    meta = ProfileMetadata(
        gpu="test-gpu",
        engine_version="0.26.0",
        model="m",
        drafter="d",
        method="eagle3",
        num_speculative_tokens=3,
        max_num_seqs=128,
        created_at="2026-11-30T00:00:00Z",  # type: ignore[arg-type]
        tool_version="test",
    )
    return Profile(
        metadata=meta,
        batch_grid=grid,
        ks=ks,
        cells=tuple(cells),
        acceptance=AcceptanceProfile(rates=tuple(prior)),
    )


@dataclass
class ModelEngine:
    """One replica: counters grow exactly as the goodput model says for the running table."""

    step_times: StepTimes
    rates: tuple[float, ...]
    state: TableState
    load: int = 16
    step_scale: float = 1.0  # live step time / profile (profile drift)
    k_scale: dict[int, float] = field(default_factory=dict)  # serving slows this k only
    # ... and this k's steps amid another k's run (bursts) by this: bursts that misread it
    burst_scale: dict[int, float] = field(default_factory=dict)
    prefill_tokens_per_step: float = 0.0  # prompt tokens riding along each decode step
    totals: dict[str, float] = field(default_factory=dict)
    drafted: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    accepted: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    cells: dict[CellKey, CellTotals] = field(default_factory=dict)

    def run(self, seconds: float) -> None:
        k = self.state.k_for(self.load)
        # The plugin runs one step at K every ``exploration_interval`` steps (every position is
        # drafted), and neighbour bursts at the allowed k next to the table's, lower and higher
        # in turn (their step times are measured).
        state = self.state
        shares = {k: 1.0}
        if state.exploration_interval and k != 3:
            shares[3] = 1 / state.exploration_interval
        if state.neighbour_interval:
            allowed = sorted(state.allowed_k)
            near = [a for a in allowed if a < k][-1:] + [a for a in allowed if a > k][:1]
            if state.neighbour_ks:  # the daemon's pick instead of the adjacent ones
                near = [a for a in state.neighbour_ks if a != k]
            for other in near or ():
                share = state.neighbour_burst / state.neighbour_interval / len(near)
                shares[other] = shares.get(other, 0.0) + share
        shares[k] = 2.0 - sum(shares.values())
        for step_k, share in shares.items():
            amid = self.burst_scale.get(step_k, 1.0) if step_k != k else 1.0
            self._run_at(step_k, seconds * share, amid)

    def _run_at(self, k: int, seconds: float, amid: float = 1.0) -> None:
        step_ms = self.step_times.at(self.load, k) * self.step_scale * self.k_scale.get(k, 1.0)
        step_ms *= amid
        steps = seconds * 1000.0 / step_ms
        requests = steps * self.load
        for i in range(k):
            self.drafted[i] += requests
            self.accepted[i] += requests * self.rates[i]
        self.totals["drafts"] = self.totals.get("drafts", 0.0) + (requests if k else 0.0)
        self.totals["tokens"] = self.totals.get("tokens", 0.0) + requests * (
            1.0 + sum(self.rates[:k])
        )
        step_s = step_ms / 1000.0
        tokens = requests * (k + 1) + steps * self.prefill_tokens_per_step
        ran = CellTotals(steps, steps * step_s, steps * step_s**2, tokens, requests)
        key = cell_key(k, self.load)
        self.cells[key] = self.cells.get(key, CellTotals()) + ran

    def restart(self, starting: Sequence[Sequence[int]]) -> None:
        self.state = TableState.initial(
            starting,
            num_speculative_tokens=self.state.num_speculative_tokens,
            max_num_seqs=self.state.max_num_seqs,
        )
        self.totals = {}
        self.drafted = [0.0] * len(self.drafted)
        self.accepted = [0.0] * len(self.accepted)
        self.cells = {}


class FakeAdmin(StateAdminClient):
    """Admin client over the real pure transitions on the model engine's state;
    ``fail_next`` temporary errors first."""

    def __init__(self, engine: ModelEngine) -> None:
        self.engine = engine
        super().__init__(engine.state, identity=EngineIdentity("0.26.0", "m"))
        self.fail_next = 0
        self.calls: list[str] = []

    @property  # type: ignore[override]
    def state(self) -> TableState:
        return self.engine.state

    @state.setter
    def state(self, value: TableState) -> None:
        self.engine.state = value

    def _maybe_fail(self, what: str) -> None:
        self.calls.append(what)
        if self.fail_next > 0:
            self.fail_next -= 1
            raise TemporaryError(f"{what}: HTTP 503: engine busy")

    def answer(self, request: AdminRequest, if_match: int | None) -> TableView:
        if isinstance(request, TablePut):
            self._maybe_fail("PUT table")
        else:
            self._maybe_fail("PUT settings" if isinstance(request, SettingsPut) else "GET")
        return super().answer(request, if_match)


class ModelSource:
    """A source over ``ModelEngine``s: each ``collect`` runs them for the elapsed time and
    reports the increases (with reset detection, as the real sources do)."""

    def __init__(self, engines: dict[str, ModelEngine], clock: FakeClock) -> None:
        self.engines = engines
        self.clock = clock
        self.last: float | None = None
        self.seen: dict[
            str,
            tuple[dict[str, float], list[float], list[float], dict[CellKey, CellTotals]],
        ] = {}
        self.down: str | None = None
        self.missing: set[str] = set()  # named, without data (scrape failed)
        self.removed: set[str] = set()  # no longer named at all (a pod deleted)
        self.forgotten: list[str] = []
        self.hook: Callable[[], None] | None = None

    def forget(self, replica: str) -> None:
        self.forgotten.append(replica)
        self.seen.pop(replica, None)

    def collect(self, now: float, *, on_replica: Callable[[], bool] | None = None) -> SourceResult:
        if self.down is not None:
            raise TemporaryError(self.down)
        interval = 0.0 if self.last is None else now - self.last
        self.last = now
        observations: dict[str, Observation] = {}
        for name, engine in self.engines.items():
            if name in self.missing or name in self.removed:
                continue
            if interval > 0:
                engine.run(interval)
            before = self.seen.get(name)
            snap = (
                dict(engine.totals),
                list(engine.drafted),
                list(engine.accepted),
                dict(engine.cells),
            )
            self.seen[name] = snap
            if before is None or interval <= 0:
                continue
            reset = snap[0].get("tokens", 0.0) < before[0].get("tokens", 0.0)
            base = ({}, [0.0] * 3, [0.0] * 3, {}) if reset else before
            cells = {key: t.since(base[3].get(key, CellTotals())) for key, t in snap[3].items()}
            cells = {key: t for key, t in cells.items() if t.steps > 0}
            observations[name] = Observation(
                replica=name,
                admin_url=name,
                interval_s=interval,
                drafted=tuple(x - y for x, y in zip(snap[1], base[1], strict=True)),
                accepted=tuple(x - y for x, y in zip(snap[2], base[2], strict=True)),
                mean_batch=mean_batch_of(cells),
                generated_tokens=snap[0].get("tokens", 0.0) - base[0].get("tokens", 0.0),
                step_cells=cells,
                reset=reset,
                model_name="m",
            )
        return SourceResult(
            observations=observations,
            problems={
                name: "scrape failed: connection refused" for name in self.missing - self.removed
            },
        )


def replica_runtime(pool: PoolProfile, *, load: int, **changes: object) -> ReplicaRuntime:
    """A replica's memory for the planner: all load at ``load``, no decision pending."""
    rt = ReplicaRuntime(
        replica="r1",
        admin_url="r1",
        pool=pool,
        record=ReplicaRecord(),
        loads=LoadTracker(memory=0.8, weights={load: 1.0}),
        history=GoodputHistory(keep_s=600),
        step_time=StepTimeEstimator(StepTimeLayout(pool.step_times, 128)),
        needs_decision=False,
    )
    for key, value in changes.items():
        setattr(rt, key, value)
    return rt
