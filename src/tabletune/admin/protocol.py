"""Wire models of the admin API (``/tabletune/v1``). Stable shapes; see docs/design.md."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tabletune.step_cells import (
    CellKey,
    CellTotals,
    cells_from_wire,
    cells_to_wire,
    switches_from_wire,
)

API_PREFIX = "/tabletune/v1"
TABLE_PATH = f"{API_PREFIX}/table"
SETTINGS_PATH = f"{API_PREFIX}/settings"
STEP_CELLS_PATH = f"{API_PREFIX}/step-cells"
STEP_CELLS_FIELD = "step_cells"
"""added to a conditional table PUT's answer, accepted or 412: the step cells decided on"""
MAX_BODY_BYTES = 64 * 1024
# Bounds of every integer a request may carry. The plugin hands the body to the engine process
# as msgpack, which cannot encode integers beyond 64 bits; and no batch size or k comes near
# 2^31. The table's own rules (positive bounds, k <= K) are the engine's to check.
MAX_WIRE_INT = 2**31 - 1
WireInt = Annotated[int, Field(ge=-MAX_WIRE_INT, le=MAX_WIRE_INT)]
# A cell's cumulative step count: every count below 2^53 is exact as the float the step cells
# carry (a century of 1 ms steps is 2^41).
MAX_STEP_COUNT = 2**53
# How each step's k is chosen: the table (with exploration, hysteresis), or the Nightjar-style
# bandit per batch size learning from the measured steps (plugin/bandit.py).
StepPolicyName = Literal["table", "nightjar"]
# Which step the step cells leave out when k changes (plugin/step_timer.py): "drafts", one that
# drafted another k than it verified; "verified", the first step verifying a new k (plugins
# before 2026-12-02, whose views lack the field: their neighbour bursts read fast).
StepSwitchRule = Literal["drafts", "verified"]
STEP_SWITCH_RULE: StepSwitchRule = "drafts"
MAX_NIGHTJAR_EXPLORATION = 100.0


@dataclass(frozen=True)
class EngineIdentity:
    """Which engine a table state belongs to: fixed when the engine starts, handed whole to
    whatever answers for it. The table view carries it as three flat fields of the same names."""

    engine_version: str
    model_name: str | None = None
    tensor_parallel_size: int | None = None  # None: the engine does not report it


class TableView(BaseModel):
    """What ``GET /tabletune/v1/table`` returns."""

    model_config = ConfigDict(extra="ignore")  # newer servers may add fields

    dynamic: bool = Field(description="false: vLLM runs a static k; the table cannot be set")
    table: list[list[int]] | None = Field(description="vLLM's JSON form; null when static")
    version: int = Field(ge=0, description="bumped on every accepted change (table or settings)")
    allowed_k: list[int] = Field(description="k with captured CUDA graphs (the starting table's)")
    num_speculative_tokens: int = Field(ge=0, description="K: the longest draft length")
    max_num_seqs: int = Field(ge=1)
    exploration_interval: int = Field(ge=0, description="one step at K every N steps; 0 = off")
    hysteresis: int = Field(ge=0, description="keep k while B is within h of a table edge")
    neighbour_interval: int = Field(
        default=0, ge=0, description="a burst at a k next to the table's every N steps; 0 = off"
    )
    neighbour_burst: int = Field(
        default=4, ge=1, description="consecutive steps of one neighbour burst"
    )
    neighbour_ks: list[int] = Field(
        default_factory=list,
        description="the k bursts may run (other than the table's); empty: the adjacent ones",
    )
    step_timing: bool = Field(
        default=True, description="false: no per-step work (step timing, exploration, hysteresis)"
    )
    policy: StepPolicyName = Field(
        default="table",
        description="how each step's k is chosen: the table, or the Nightjar-style bandit",
    )
    nightjar_exploration: float = Field(
        default=1.0, ge=0, description="the bandit's UCB1 exploration constant c"
    )
    exploration_steps: int = Field(
        default=0, ge=0, description="steps run at the longest k by exploration, since start"
    )
    neighbour_steps: int = Field(
        default=0, ge=0, description="steps run at a neighbouring k, since start"
    )
    nightjar_steps: int = Field(
        default=0, ge=0, description="steps whose k the Nightjar-style bandit chose, since start"
    )
    step_switch_rule: StepSwitchRule = Field(
        default="verified",
        description=(
            "the step the step cells leave out when k changes: one drafting another k than it "
            "verified ('drafts'), or, in plugins before 2026-12-02, the first verifying a new k"
        ),
    )
    plugin_version: str
    engine_version: str
    model_name: str | None = None
    tensor_parallel_size: int | None = Field(
        default=None, ge=1, description="the engine's tensor-parallel size (None: not reported)"
    )
    reason: str | None = Field(default=None, description="why the table is read-only, if it is")


class CellSteps(BaseModel):
    """A table PUT's precondition: the step cell of ``k`` and ``cell_of(batch_size)`` has counted
    at least ``at_least`` steps since the engine started (its ``steps`` in the step cells)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    k: int = Field(ge=0, le=MAX_WIRE_INT)
    batch_size: int = Field(ge=1, le=MAX_WIRE_INT)
    at_least: int = Field(ge=0, le=MAX_STEP_COUNT)


class TablePut(BaseModel):
    """Body of ``PUT /tabletune/v1/table``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    table: list[list[WireInt]] = Field(description="[[start, end, k], ...] as vLLM takes it")
    allow_uncaptured: bool = Field(
        default=False,
        description="allow k outside the starting table (no captured CUDA graph: slow)",
    )
    when_cell_steps: CellSteps | None = Field(
        default=None,
        description="swap only if this cell holds that many steps (else 412), decided between "
        "two engine steps; either answer carries the step cells read at that moment",
    )


class SettingsPut(BaseModel):
    """Body of ``PUT /tabletune/v1/settings``; omitted fields stay as they are."""

    model_config = ConfigDict(extra="forbid", strict=True)

    exploration_interval: int | None = Field(default=None, ge=0, le=1_000_000)
    hysteresis: int | None = Field(default=None, ge=0, le=100_000)
    neighbour_interval: int | None = Field(default=None, ge=0, le=1_000_000)
    neighbour_burst: int | None = Field(default=None, ge=1, le=1_000)
    neighbour_ks: list[Annotated[int, Field(ge=0, le=1_000)]] | None = Field(
        default=None, max_length=64
    )
    step_timing: bool | None = None
    policy: StepPolicyName | None = None
    nightjar_exploration: float | None = Field(
        default=None, ge=0, le=MAX_NIGHTJAR_EXPLORATION, allow_inf_nan=False
    )


@dataclass(frozen=True)
class StepCellsRead:
    """The engine's step cells, totals since ``started_at``: what the engine side's
    ``tabletune_get_step_cells`` utility answers and ``GET /tabletune/v1/step-cells`` returns
    (``to_wire``: ``tabletune.step_cells.cells_to_wire`` plus ``started_at``)."""

    cells: dict[CellKey, CellTotals]
    steps_without_decode: float
    started_at: float  # wall time the engine's counts start from
    switch_steps: float = 0.0  # steps drafting another k than they verified: not in the cells
    switch_seconds: float = 0.0

    def to_wire(self) -> dict[str, Any]:
        switches = (self.switch_steps, self.switch_seconds)
        return {
            "started_at": self.started_at,
            **cells_to_wire(self.cells, self.steps_without_decode, switches=switches),
        }

    @classmethod
    def from_wire(cls, data: object) -> StepCellsRead:
        """Inverse of ``to_wire``; ValueError naming the first problem."""
        cells, without = cells_from_wire(data)
        switch_steps, switch_seconds = switches_from_wire(data)
        started = data.get("started_at") if isinstance(data, dict) else None
        if (
            isinstance(started, bool)
            or not isinstance(started, int | float)
            or not math.isfinite(started)
            or started < 0
        ):
            raise ValueError(f"started_at={started!r:.60}")
        return cls(cells, without, float(started), switch_steps, switch_seconds)


@dataclass(frozen=True)
class TableAnswer:
    """What a backend answers an accepted table PUT: the new view, and for a conditional PUT
    (``when_cell_steps``) the step cells its condition was decided on."""

    view: TableView
    step_cells: StepCellsRead | None = None


def describe_problems(error: ValidationError) -> str:
    """Every problem of a refused body (a typo'd field shows as both 'missing' and 'extra'),
    '; '-joined, as the admin API reports them."""
    return "; ".join(
        f"{'.'.join(str(p) for p in problem['loc']) or 'body'}: {problem['msg']}"
        for problem in error.errors()
    )
