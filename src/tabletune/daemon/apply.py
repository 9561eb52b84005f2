"""Applying one replica's planned effects through its admin API, in order: the only place the
daemon changes a replica. Each call carries ``If-Match`` with the version the previous one
returned, so a table changed behind our back is never overwritten. The first failure stops
the rest of the replica's effects (nothing is lost: the next cycle plans again)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tabletune.admin.client import AdminRefused
from tabletune.admin.protocol import TableView
from tabletune.daemon.plan import Effect, PushTable, RollBack, SetPluginSettings
from tabletune.errors import TableTuneError


class AdminApi(Protocol):
    def get_table(self) -> TableView: ...

    def put_table(
        self,
        table: Sequence[Sequence[int]],
        *,
        if_match: int | None = None,
        allow_uncaptured: bool = False,
    ) -> TableView: ...

    def put_settings(
        self,
        *,
        exploration_interval: int | None = None,
        hysteresis: int | None = None,
        neighbour_interval: int | None = None,
        neighbour_burst: int | None = None,
        neighbour_ks: list[int] | None = None,
        if_match: int | None = None,
    ) -> TableView: ...


# ``call(action, what)`` runs one admin request with the daemon's retry schedule.
Call = Callable[[Callable[[], TableView], str], TableView]


@dataclass
class Applied:
    """What happened to one replica's effects."""

    view: TableView  # the replica's view after the last effect that went through
    done: list[Effect] = field(default_factory=list)
    failure: str | None = None  # why the next effect did not go through
    conflict: bool = False  # a push met a table changed meanwhile (409): decide again


def apply_effects(
    replica: str,
    effects: Sequence[Effect],
    view: TableView,
    client: AdminApi,
    *,
    call: Call,
) -> Applied:
    applied = Applied(view=view)
    for effect in effects:
        version = applied.view.version
        try:
            applied.view = _apply_one(replica, effect, version, client, call)
        except AdminRefused as error:
            if isinstance(effect, PushTable) and error.status == 409:
                applied.conflict = True
                applied.failure = f"table changed under us: {error.detail}"
            else:
                applied.failure = f"{_what(effect)} refused: {error}"
            return applied
        except TableTuneError as error:
            applied.failure = f"{_what(effect)} failed: {error}"
            return applied
        applied.done.append(effect)
    return applied


def _apply_one(
    replica: str, effect: Effect, version: int, client: AdminApi, call: Call
) -> TableView:
    if isinstance(effect, SetPluginSettings):
        return call(
            lambda: client.put_settings(
                exploration_interval=effect.exploration_interval,
                hysteresis=effect.hysteresis,
                neighbour_interval=effect.neighbour_interval,
                neighbour_burst=effect.neighbour_burst,
                neighbour_ks=list(effect.neighbour_ks),
                if_match=version,
            ),
            f"PUT settings {replica}",
        )
    if isinstance(effect, PushTable):
        assert effect.decision.new is not None
        table = [list(r) for r in effect.decision.new]
        return call(lambda: client.put_table(table, if_match=version), f"PUT table {replica}")
    back = [list(r) for r in effect.pending.previous]
    return call(lambda: client.put_table(back, if_match=version), f"PUT table (rollback) {replica}")


def _what(effect: Effect) -> str:
    if isinstance(effect, SetPluginSettings):
        return "setting the plugin's exploration and hysteresis"
    if isinstance(effect, RollBack):
        return "rollback"
    return "push"
