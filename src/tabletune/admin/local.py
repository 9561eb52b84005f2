"""An in-process backend: one ``TableState`` behind a lock (tests and fakes use it), and the step
cells of whatever counts them for it, if anything does."""

from __future__ import annotations

import threading
from collections.abc import Callable

from tabletune import __version__
from tabletune.admin.protocol import (
    EngineIdentity,
    SettingsPut,
    StepCellsRead,
    TableAnswer,
    TablePut,
    TableView,
)
from tabletune.admin.state import AdminError, TableState, table_put


class LocalBackend:
    """Holds a TableState; changes are whole swaps under a lock, so readers never see halves."""

    def __init__(
        self,
        state: TableState,
        *,
        identity: EngineIdentity,
        step_cells: Callable[[], StepCellsRead] | None = None,
    ) -> None:
        self._state = state
        self._lock = threading.Lock()
        self.identity = identity
        self.step_cells = step_cells
        """what counts the step cells (None: nothing, the route answers 404)"""

    @property
    def state(self) -> TableState:
        return self._state

    def _view(self) -> TableView:
        return self._state.view(plugin_version=__version__, identity=self.identity)

    async def get_view(self) -> TableView:
        return self._view()

    async def get_step_cells(self) -> StepCellsRead:
        if self.step_cells is None:
            raise AdminError(404, "this server counts no step cells")
        return self.step_cells()

    async def put_table(self, body: TablePut, if_match: int | None) -> TableAnswer:
        with self._lock:
            self._state, read = table_put(
                self._state, body, if_match=if_match, read_cells=self.step_cells
            )
            return TableAnswer(self._view(), read)

    async def put_settings(self, body: SettingsPut, if_match: int | None) -> TableView:
        with self._lock:
            self._state = self._state.with_settings(body, if_match=if_match)
            return self._view()
