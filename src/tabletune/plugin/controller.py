"""The engine side's logic, pure: one engine's table state, requests in, lookups out.

``EngineTableController`` runs inside the engine-core process. vLLM calls the utility methods
between scheduler steps on the engine thread, so a change is one attribute assignment
(``install``) that the next step sees whole. Every refusal leaves state and lookup untouched.
The ``step_timing`` setting switches all per-step work of the plugin at once: the step timer
(when one is given) and the ``StepPolicy`` (a plain list is installed while it is off). The
``policy`` setting ``nightjar`` installs the Nightjar-style bandit (``NightjarLookup``) instead of
the table's lookup; the table stays in the state, what ``policy: table`` goes back to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from tabletune import __version__
from tabletune.admin.protocol import (
    EngineIdentity,
    SettingsPut,
    StepCellsRead,
    TablePut,
    TableView,
    describe_problems,
)
from tabletune.admin.state import AdminError, TableState, table_put
from tabletune.plugin.bandit import NightjarLookup
from tabletune.plugin.policy import StepPolicy
from tabletune.plugin.step_timer import StepTimer
from tabletune.plugin.wire import error_envelope, ok_envelope

# What goes into Scheduler.dynamic_sd_lookup: a plain list, or a policy read once per step.
Lookup = list[int] | StepPolicy | NightjarLookup
Install = Callable[[Lookup], None]


class EngineTableController:
    """Holds a ``TableState`` and installs the matching lookup into the scheduler."""

    def __init__(
        self,
        state: TableState,
        install: Install,
        *,
        identity: EngineIdentity,
        timer: StepTimer | None = None,
        read_cells: Callable[[], StepCellsRead] | None = None,
    ) -> None:
        self._state = state
        self._read_cells = read_cells  # what a conditional table PUT is decided on
        self._install = install
        self._timer = timer
        self._policy: StepPolicy | None = None
        self._bandit: NightjarLookup | None = None
        self._retired_exploration_steps = 0
        self._retired_neighbour_steps = 0
        self._retired_nightjar_steps = 0
        self.identity = identity
        if timer is not None:
            timer.set_enabled(state.step_timing)

    @property
    def state(self) -> TableState:
        return self._state

    @property
    def exploration_steps(self) -> int:
        live = self._policy.exploration_steps if self._policy is not None else 0
        return self._retired_exploration_steps + live

    @property
    def neighbour_steps(self) -> int:
        live = self._policy.neighbour_steps if self._policy is not None else 0
        return self._retired_neighbour_steps + live

    @property
    def nightjar_steps(self) -> int:
        live = self._bandit.steps if self._bandit is not None else 0
        return self._retired_nightjar_steps + live

    def view(self) -> TableView:
        view = self._state.view(plugin_version=__version__, identity=self.identity)
        return view.model_copy(
            update={
                "exploration_steps": self.exploration_steps,
                "neighbour_steps": self.neighbour_steps,
                "nightjar_steps": self.nightjar_steps,
            }
        )

    # The three utility calls: plain dicts in and out (they cross a process boundary).

    def get(self) -> dict[str, Any]:
        return ok_envelope(self.view())

    def put_table(self, body: object, if_match: int | None) -> dict[str, Any]:
        """The table, swapped whole; with ``when_cell_steps`` only if the step cells read now
        (between two steps, as every utility call) hold the steps asked, and either answer then
        carries that reading."""
        try:
            new_state, read = table_put(
                self._state,
                self._parse(TablePut, body),
                if_match=if_match,
                read_cells=self._read_cells,
            )
        except AdminError as error:
            return error_envelope(error)
        self._swap(new_state)
        return ok_envelope(self.view(), read)

    def put_settings(self, body: object, if_match: int | None) -> dict[str, Any]:
        return self._apply(
            lambda: self._state.with_settings(self._parse(SettingsPut, body), if_match=if_match)
        )

    def _apply(self, transition: Callable[[], TableState]) -> dict[str, Any]:
        try:
            new_state = transition()
        except AdminError as error:
            return error_envelope(error)
        self._swap(new_state)
        return ok_envelope(self.view())

    @staticmethod
    def _parse(model: type[TablePut] | type[SettingsPut], body: object) -> Any:
        if not isinstance(body, dict):
            raise AdminError(422, "body must be a JSON object")
        try:
            return model.model_validate(body)
        except ValidationError as error:
            raise AdminError(422, describe_problems(error)) from None

    def _swap(self, state: TableState) -> None:
        self._state = state
        if self._timer is not None:
            self._timer.set_enabled(state.step_timing)
        if not state.dynamic:
            return  # static k: nothing in the scheduler to replace (settings are recorded only)
        previous, previous_bandit = self._policy, self._bandit
        if state.step_timing and state.policy == "nightjar":
            self._bandit = self._bandit_for(state)
            self._policy = None
            self._install(self._bandit)
        else:
            self._bandit = None
            self._policy = self._step_policy_for(state)
            self._install(list(state.lookup) if self._policy is None else self._policy)
        if previous is not None and previous is not self._policy:
            self._retired_exploration_steps += previous.exploration_steps
            self._retired_neighbour_steps += previous.neighbour_steps
        if previous_bandit is not None and previous_bandit is not self._bandit:
            self._retired_nightjar_steps += previous_bandit.steps

    def _bandit_for(self, state: TableState) -> NightjarLookup:
        """The running bandit while the policy stays on with the same constant (tables and
        other settings do not touch what it learnt); else a fresh one."""
        running = self._bandit
        if running is not None and running.exploration == state.nightjar_exploration:
            return running
        return NightjarLookup(
            state.allowed_k,
            max_num_seqs=state.max_num_seqs,
            exploration=state.nightjar_exploration,
        )

    def _step_policy_for(self, state: TableState) -> StepPolicy | None:
        """The table's per-step policy, or None where a plain list does (nothing per step)."""
        previous = self._policy
        per_step = state.exploration_interval or state.hysteresis or state.neighbour_interval
        if not (state.step_timing and per_step):
            return None
        return StepPolicy(
            state.lookup,
            explore_k=max(state.allowed_k),
            exploration_interval=state.exploration_interval,
            hysteresis=state.hysteresis,
            neighbour_interval=state.neighbour_interval,
            neighbour_burst=state.neighbour_burst,
            neighbour_ks=state.neighbour_ks,
            allowed_k=state.allowed_k,
            steps=previous.steps if previous is not None else 0,
            # Hysteresis holds the k of the previous step while the load sits near an edge
            # of *this* table; a new table starts fresh (a k held over from the old one
            # would stay for as long as the load does not move).
            previous_k=(
                previous.previous_k
                if previous is not None and previous.lookup == state.lookup
                else None
            ),
        )
