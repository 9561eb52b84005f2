"""The engine-side table state and its transitions, pure: validate fully, then swap whole.

Both the vLLM plugin (inside the engine-core process) and the emulator hold a ``TableState``
and change it only through ``with_table`` / ``with_settings``, which return a new state or raise
``AdminError`` and change nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from tabletune.admin.protocol import (
    STEP_SWITCH_RULE,
    CellSteps,
    EngineIdentity,
    SettingsPut,
    StepCellsRead,
    StepPolicyName,
    TablePut,
    TableView,
)
from tabletune.baselines.nightjar import DEFAULT_EXPLORATION
from tabletune.schemas.table import Range, TableError, dense_lookup, normalize_ranges
from tabletune.step_cells import CellTotals, cell_key, cell_label, cell_of

# Versions count accepted changes; 18 digits stay below 2^63 (msgpack to the engine process).
MAX_VERSION_DIGITS = 18


class AdminError(Exception):
    """A refused admin request: HTTP status and a reason for the caller."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class CellNotFull(AdminError):
    """A conditional table PUT whose cell has fewer steps than asked (412): nothing changed;
    ``step_cells`` is the reading the condition was decided on."""

    def __init__(self, detail: str, step_cells: StepCellsRead) -> None:
        super().__init__(412, detail)
        self.step_cells = step_cells


def check_cell_steps(condition: CellSteps, read: StepCellsRead) -> None:
    """Raise ``CellNotFull`` unless ``read`` holds ``condition.at_least`` steps in its cell."""
    key = cell_key(condition.k, condition.batch_size)
    steps = read.cells.get(key, CellTotals()).steps
    if steps < condition.at_least:
        raise CellNotFull(
            f"when_cell_steps: cell k={condition.k} batch {cell_label(key[1:])} has "
            f"{steps:.0f} steps, fewer than {condition.at_least}: table unchanged",
            read,
        )


def table_put(
    state: TableState,
    body: TablePut,
    *,
    if_match: int | None,
    read_cells: Callable[[], StepCellsRead] | None,
) -> tuple[TableState, StepCellsRead | None]:
    """The state after a table PUT, and for a conditional one the step cells it was decided on:
    every other rule first (a 412 means the table would have been taken), then the condition
    on one reading (``read_cells``; None: nothing counts step cells here, 404)."""
    new_state = state.with_table(body, if_match=if_match)
    if body.when_cell_steps is None:
        return new_state, None
    if read_cells is None:
        raise AdminError(404, "this server counts no step cells")
    read = read_cells()
    check_cell_steps(body.when_cell_steps, read)
    return new_state, read


def parse_if_match(header: str | None) -> int | None:
    """``If-Match: 7`` or ``If-Match: "7"`` -> 7; ``*`` or absent -> None."""
    if header is None or header.strip() == "*":
        return None
    value = header.strip()
    if value.startswith("W/"):
        value = value[2:]
    value = value.strip('"')
    # ASCII digits only: str.isdigit also takes '²' and other digits int() refuses.
    if not (value.isascii() and value.isdigit()):
        raise AdminError(400, f"If-Match must be a table version number, got {header[:100]!r}")
    if len(value) > MAX_VERSION_DIGITS:
        raise AdminError(400, f"If-Match: a version has at most {MAX_VERSION_DIGITS} digits")
    return int(value)


@dataclass(frozen=True)
class TableState:
    """One engine's table as the plugin/emulator holds it."""

    ranges: tuple[Range, ...] | None
    num_speculative_tokens: int
    max_num_seqs: int
    allowed_k: frozenset[int]
    version: int = 0
    exploration_interval: int = 0
    hysteresis: int = 0
    neighbour_interval: int = 0
    neighbour_burst: int = 4
    neighbour_ks: tuple[int, ...] = ()  # empty: the allowed k adjacent to the table's
    step_timing: bool = True
    policy: StepPolicyName = "table"
    nightjar_exploration: float = DEFAULT_EXPLORATION
    lookup: tuple[int, ...] = field(default=(), compare=False)

    @classmethod
    def initial(
        cls,
        ranges: Iterable[Iterable[int]] | None,
        *,
        num_speculative_tokens: int,
        max_num_seqs: int,
    ) -> TableState:
        """The state at start: allowed k are the lengths in the starting table (captured)."""
        if ranges is None:
            return cls(
                ranges=None,
                num_speculative_tokens=num_speculative_tokens,
                max_num_seqs=max_num_seqs,
                allowed_k=frozenset({num_speculative_tokens}),
            )
        parsed = normalize_ranges([list(r) for r in ranges])
        allowed = frozenset(min(k, num_speculative_tokens) for _, _, k in parsed)
        return cls(
            ranges=parsed,
            num_speculative_tokens=num_speculative_tokens,
            max_num_seqs=max_num_seqs,
            allowed_k=allowed,
            lookup=tuple(dense_lookup(parsed, max_num_seqs, num_speculative_tokens)),
        )

    @property
    def dynamic(self) -> bool:
        return self.ranges is not None

    def k_for(self, batch_size: int) -> int:
        """k the scheduler uses at this batch size (vLLM clamps B to max_num_seqs)."""
        if self.ranges is None:
            return self.num_speculative_tokens
        return self.lookup[max(1, min(batch_size, self.max_num_seqs))]

    def with_table(self, body: TablePut, *, if_match: int | None) -> TableState:
        if self.ranges is None:
            raise AdminError(
                409,
                "vLLM runs a static num_speculative_tokens: CUDA graphs are captured at start, "
                "so a table needs a restart with num_speculative_tokens_per_batch_size set",
            )
        self._check_version(if_match)
        try:
            parsed = normalize_ranges(body.table, max_k=self.num_speculative_tokens)
        except TableError as error:
            raise AdminError(422, str(error)) from None
        uncaptured = sorted({k for _, _, k in parsed} - self.allowed_k)
        if uncaptured and not body.allow_uncaptured:
            raise AdminError(
                422,
                f"k {uncaptured} not in the starting table (captured: {sorted(self.allowed_k)}); "
                "set allow_uncaptured to force (those steps run without full CUDA graphs)",
            )
        if body.when_cell_steps is not None:
            self._check_cell(body.when_cell_steps)
        return replace(
            self,
            ranges=parsed,
            version=self.version + 1,
            lookup=tuple(dense_lookup(parsed, self.max_num_seqs, self.num_speculative_tokens)),
        )

    def with_settings(self, body: SettingsPut, *, if_match: int | None) -> TableState:
        self._check_version(if_match)
        ks = (
            self.neighbour_ks
            if body.neighbour_ks is None
            else tuple(sorted(set(body.neighbour_ks)))
        )
        uncaptured = sorted(set(ks) - self.allowed_k)
        if uncaptured:
            raise AdminError(
                422,
                f"neighbour_ks: k {uncaptured} not in the starting table "
                f"(captured: {sorted(self.allowed_k)})",
            )
        policy = self.policy if body.policy is None else body.policy
        step_timing = self.step_timing if body.step_timing is None else body.step_timing
        if policy == "nightjar" and self.ranges is None:
            raise AdminError(
                409,
                "policy nightjar: vLLM runs a static num_speculative_tokens, "
                "so there is no k to choose per step",
            )
        if policy == "nightjar" and not step_timing:
            raise AdminError(
                422, "policy nightjar learns from the step timer: it needs step_timing true"
            )
        return replace(
            self,
            exploration_interval=(
                self.exploration_interval
                if body.exploration_interval is None
                else body.exploration_interval
            ),
            hysteresis=self.hysteresis if body.hysteresis is None else body.hysteresis,
            neighbour_interval=(
                self.neighbour_interval
                if body.neighbour_interval is None
                else body.neighbour_interval
            ),
            neighbour_burst=(
                self.neighbour_burst if body.neighbour_burst is None else body.neighbour_burst
            ),
            neighbour_ks=ks,
            step_timing=step_timing,
            policy=policy,
            nightjar_exploration=(
                self.nightjar_exploration
                if body.nightjar_exploration is None
                else float(body.nightjar_exploration)
            ),
            version=self.version + 1,
        )

    def _check_cell(self, condition: CellSteps) -> None:
        """A condition on a cell no step of this engine can be counted in is a mistake."""
        k, batch = condition.k, condition.batch_size
        if k > self.num_speculative_tokens or batch > self.max_num_seqs:
            raise AdminError(
                422,
                f"when_cell_steps: no step runs in cell k={k} batch {cell_label(cell_of(batch))}"
                f" (k in 0..{self.num_speculative_tokens}, batch_size in 1..{self.max_num_seqs})",
            )

    def _check_version(self, if_match: int | None) -> None:
        if if_match is not None and if_match != self.version:
            raise AdminError(
                409, f"version mismatch: If-Match {if_match}, current version {self.version}"
            )

    def view(self, *, plugin_version: str, identity: EngineIdentity) -> TableView:
        return TableView(
            dynamic=self.dynamic,
            table=None if self.ranges is None else [list(r) for r in self.ranges],
            version=self.version,
            allowed_k=sorted(self.allowed_k),
            num_speculative_tokens=self.num_speculative_tokens,
            max_num_seqs=self.max_num_seqs,
            exploration_interval=self.exploration_interval,
            hysteresis=self.hysteresis,
            neighbour_interval=self.neighbour_interval,
            neighbour_burst=self.neighbour_burst,
            neighbour_ks=list(self.neighbour_ks),
            step_timing=self.step_timing,
            policy=self.policy,
            nightjar_exploration=self.nightjar_exploration,
            step_switch_rule=STEP_SWITCH_RULE,
            plugin_version=plugin_version,
            engine_version=identity.engine_version,
            model_name=identity.model_name,
            tensor_parallel_size=identity.tensor_parallel_size,
            reason=None if self.dynamic else "static num_speculative_tokens (no table at start)",
        )
