"""One emulated vLLM-with-plugin: engine + the plugin's engine and HTTP sides + faults, on a
clock that maps wall time to simulated time.

Simulated time is ``speed * (wall - start)``: whatever asks (a scrape, an admin call, the truth
endpoint) first brings the engine up to *now*, so a Prometheus stamping samples with its own
wall clock sees counters that grow ``speed`` times faster than real time but are consistent
(rates are per wall second; ratios such as acceptance do not depend on ``speed``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from tabletune.admin.protocol import (
    SettingsPut,
    StepCellsRead,
    TableAnswer,
    TablePut,
    TableView,
)
from tabletune.admin.state import AdminError
from tabletune.plugin.controller import EngineTableController
from tabletune.plugin.engine_backend import EngineUtilityBackend
from tabletune.plugin.wire import GET_STEP_CELLS, GET_TABLE, PUT_SETTINGS, PUT_TABLE
from tabletune.schemas import Profile
from tabletune.sim.build import build_engine, start_engine_side
from tabletune.sim.engine import EngineSim
from tabletune.sim.faults import FaultPlan
from tabletune.sim.metrics import registry_for, render
from tabletune.sim.processes import LoadOverride, SwitchRates
from tabletune.sim.scenario import Scenario, check_rates
from tabletune.solver import SolverError, build_table, evaluate_table


@dataclass(frozen=True)
class SimClock:
    """Simulated seconds since start = speed * wall seconds since ``start_wall``."""

    speed: float = 1.0
    start_wall: float = field(default_factory=time.time)
    wall: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        if not self.speed > 0:
            raise ValueError("speed must be > 0")

    def sim_now(self) -> float:
        return max(0.0, (self.wall() - self.start_wall) * self.speed)

    def wall_at(self, sim_s: float) -> float:
        return self.start_wall + sim_s / self.speed


class Unavailable(Exception):
    """The replica cannot answer now (restarting, or a /metrics outage)."""


class Replica:
    """One engine as the outside sees it; every entry point syncs to the clock first."""

    def __init__(
        self,
        scenario: Scenario,
        profile: Profile,
        *,
        base_dir: Path,
        clock: SimClock,
        index: int = 0,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self.scenario = scenario
        self.clock = clock
        self.index = index
        self.sleep = sleep
        self.engine: EngineSim = build_engine(
            scenario, profile, base_dir=base_dir, seed=scenario.seed + index
        )
        self.controller: EngineTableController = start_engine_side(
            scenario, self.engine, read_cells=self.step_cells
        )
        self.faults = FaultPlan.of(scenario.faults)
        self._pending_restarts = deque(r for r in self.faults.restarts() if r.at_s > 0)
        self.created_wall = clock.wall_at(0.0)
        self.restarts = 0
        self.label_values = (scenario.engine.model_name, scenario.engine.engine_label)
        self.registry: CollectorRegistry = registry_for(self)
        # The plugin's HTTP side, calling the engine side as vLLM's call_utility_async would.
        self.plugin_backend = EngineUtilityBackend(self._utility_call)
        self.admin = SimAdminBackend(self)

    # -- time --------------------------------------------------------------------------------

    def sync(self) -> float:
        """Bring the engine up to the clock (scenario restarts on the way); sim time now."""
        target = self.clock.sim_now()
        while self._pending_restarts and self._pending_restarts[0].at_s <= target:
            fault = self._pending_restarts.popleft()
            self.engine.advance_to(fault.at_s)
            self.restart(downtime_s=fault.downtime_s)
        self.engine.advance_to(target)
        return target

    @property
    def down(self) -> bool:
        return self.engine.now < self.engine.down_until

    def restart(self, *, downtime_s: float = 0.0) -> None:
        """vLLM restarts: counters from zero (new _created), the starting table and settings."""
        self.engine.restart(downtime_s=downtime_s)
        self.controller = start_engine_side(self.scenario, self.engine, read_cells=self.step_cells)
        self.created_wall = self.clock.wall_at(self.engine.down_until)
        self.restarts += 1

    # -- the plugin's engine side, reached like call_utility_async ----------------------------

    async def _utility_call(self, name: str, *args: Any) -> Any:
        self.sync()
        if name == GET_TABLE:
            return self.controller.get()
        if name == PUT_TABLE:
            return self.controller.put_table(*args)
        if name == PUT_SETTINGS:
            return self.controller.put_settings(*args)
        if name == GET_STEP_CELLS:
            return self.step_cells().to_wire()
        raise RuntimeError(f"no utility method {name!r}")

    def step_cells(self) -> StepCellsRead:
        """The engine's step cells as the plugin's engine side counts them (up to now)."""
        c = self.engine.counters
        return StepCellsRead(
            c.step_cells(),
            float(c.steps_without_decode),
            self.created_wall,
            float(c.switch_steps),
            c.switch_seconds,
        )

    # -- /metrics ----------------------------------------------------------------------------

    async def metrics_text(self) -> bytes:
        """The exposition text, after any injected delay; ``Unavailable`` during an outage."""
        delay = self.faults.scrape_delay_s(self.clock.sim_now())
        if delay > 0:
            await self.sleep(delay)
        now = self.sync()
        if self.down:
            raise Unavailable("engine restarting")
        if self.faults.metrics_outage(now):
            raise Unavailable("metrics outage (injected)")
        return render(self.registry)

    # -- control -----------------------------------------------------------------------------

    def set_load(self, batch_size: int) -> None:
        now = self.sync()
        self.engine.load = LoadOverride(self.engine.load, batch_size, now)

    def set_acceptance(self, rates: list[float]) -> None:
        values = check_rates(rates)
        if len(values) != self.engine.num_speculative_tokens:
            raise ValueError(f"rates must hold K={self.engine.num_speculative_tokens} values")
        now = self.sync()
        self.engine.acceptance = SwitchRates(self.engine.acceptance, values, now)

    # -- ground truth ------------------------------------------------------------------------

    def truth(self, *, last: int = 60) -> dict[str, Any]:
        """What is really going on, for scoring a controller without trusting it.

        With a serving model the truth is the model's expected step time under the traffic
        shape of now, not the profile: ``oracle_table`` is the truth-optimal table and
        ``profile_table`` what the profile alone would give."""
        now = self.sync()
        engine = self.engine
        rates = engine.acceptance.at(now)
        batch = engine.running()
        state = self.controller.state
        oracle = engine.oracle_table(rates)
        profile_only = build_table(
            engine.step_times, rates, allowed_k=engine.oracle_ks, max_batch=engine.max_num_seqs
        )
        current: dict[str, Any] = {"batch_size": batch, "waiting": engine.waiting()}
        if batch > 0:
            table_k = engine.k_for(batch)
            best_k, best = engine.best_k(batch, rates)
            table_goodput = engine.goodput(batch, table_k, rates)
            current |= {
                "table_k": table_k,
                "best_fixed_k": best_k,
                "oracle_k": oracle.per_batch_k[batch - 1],
                "table_goodput_tokens_per_s": table_goodput,
                "best_goodput_tokens_per_s": best,
                "loss": 1.0 - table_goodput / best,
                "step_ms": {
                    str(k): 1000.0 * engine.true_step_s(batch, k, rates) for k in engine.oracle_ks
                },
                "profile_step_ms": {
                    str(k): 1000.0 * engine.step_time_s(batch, k) for k in engine.oracle_ks
                },
            }
        worst: dict[str, Any] | None = None
        if state.ranges is not None:
            try:
                evaluation = evaluate_table(
                    engine.true_step_times(rates),
                    rates,
                    state.ranges,
                    max_batch=engine.max_num_seqs,
                    max_k=engine.num_speculative_tokens,
                )
                load, loss = evaluation.worst_loss()
                worst = {"batch_size": load, "loss": loss}
            except SolverError:
                worst = None  # the table uses a k that was not profiled
        history = list(engine.history)[-last:] if last > 0 else []
        c = engine.counters
        return {
            "replica": self.index,
            "sim_time_s": now,
            "engine_time_s": engine.now,
            "wall_time": self.clock.wall(),
            "speed": self.clock.speed,
            "restarts": self.restarts,
            "down": self.down,
            "rates": list(rates),
            "serving": self._serving_now(),
            "table": None if state.ranges is None else [list(r) for r in state.ranges],
            "table_version": state.version,
            "oracle_table": [list(r) for r in oracle.ranges],
            "profile_table": [list(r) for r in profile_only.ranges],
            "allowed_k": list(engine.oracle_ks),
            "current": current,
            "table_worst_loss": worst,
            "intervals": [interval.as_dict() for interval in history],
            "open_interval": engine.interval.as_dict(until=engine.now),
            "counters": {
                "steps": c.steps,
                "num_drafts": c.num_drafts,
                "num_draft_tokens": c.num_draft_tokens,
                "num_accepted_tokens": c.num_accepted_tokens,
                "generation_tokens": c.generation_tokens,
                "exploration_steps": self.controller.exploration_steps,
            },
        }

    def _serving_now(self) -> dict[str, Any] | None:
        """The traffic shape of now and what it does to step times (None: no serving model)."""
        engine = self.engine
        shape = engine.shape()
        if shape is None or engine.serving is None or engine.traffic is None:
            return None
        change = engine.traffic.next_change(engine.now)
        return {
            "shape": shape.name,
            "mean_prompt_tokens": shape.prompt.mean,
            "mean_output_tokens": shape.output.mean,
            "mean_context_tokens": shape.mean_context,
            "context_factor": engine.serving.context_factor(shape),
            "attention_ms_per_request": engine.serving.attention_seconds(1.0, shape) * 1000.0,
            "next_shape_change_s": None if math.isinf(change) else change,
        }


class SimAdminBackend:
    """The admin API's backend for one replica: the plugin's HTTP side, behind the faults."""

    def __init__(self, replica: Replica) -> None:
        self._replica = replica

    async def _gate(self) -> None:
        replica = self._replica
        now = replica.sync()
        latency = replica.faults.admin_latency_s(now)
        if latency > 0:
            await replica.sleep(latency)
            now = replica.sync()
        if replica.down:
            raise AdminError(503, "engine restarting")
        status = replica.faults.admin_error(now)
        if status is not None:
            raise AdminError(status, "injected admin fault (tabletune sim)")

    async def get_view(self) -> TableView:
        await self._gate()
        return await self._replica.plugin_backend.get_view()

    async def get_step_cells(self) -> StepCellsRead:
        await self._gate()
        return await self._replica.plugin_backend.get_step_cells()

    async def put_table(self, body: TablePut, if_match: int | None) -> TableAnswer:
        await self._gate()
        return await self._replica.plugin_backend.put_table(body, if_match)

    async def put_settings(self, body: SettingsPut, if_match: int | None) -> TableView:
        await self._gate()
        return await self._replica.plugin_backend.put_settings(body, if_match)
