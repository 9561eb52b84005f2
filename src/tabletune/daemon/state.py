"""What survives a restart: estimator counts per unit and the tables pushed per replica.

Written atomically (``save_model``: temp file, fsync, rename), so a crash leaves the old file or
the new one. A corrupt or incompatible file is reported, moved aside, and the daemon starts
fresh: never a crash.
"""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tabletune.schemas import save_model
from tabletune.schemas.table import TableError, normalize_ranges

STATE_FILE = "daemon-state.json"
STATE_FILE_MODE = 0o600


class UnitRecord(BaseModel):
    """An estimator unit: prior, weight, live counts and the last rebuilt rates."""

    model_config = ConfigDict(extra="forbid")

    prior: tuple[float, ...]
    weight: float = Field(ge=0)
    drafted: tuple[float, ...]
    accepted: tuple[float, ...]
    rates: tuple[float, ...]
    drafts_since_rebuild: float = Field(default=0.0, ge=0)
    rebuilds: int = Field(default=0, ge=0)


class TrialRecord(BaseModel):
    """A trial in force (daemon.trial): its k, the batch size it was tried at, the table it
    replaced and when it started (wall-clock seconds)."""

    model_config = ConfigDict(extra="forbid")

    k: int = Field(ge=0)
    batch: int = Field(ge=1)
    before: list[list[int]]
    started_at: float

    @field_validator("before")
    @classmethod
    def _a_table(cls, before: list[list[int]]) -> list[list[int]]:
        # It is settled against on restore: a damaged one must fail the load (file set
        # aside), not the first decision after it.
        try:
            normalize_ranges(before)
        except TableError as error:
            raise ValueError(f"the table the trial replaced: {error}") from None
        return before


class OversoldRecord(BaseModel):
    """A k its estimate oversold at a batch cell (daemon.oversold): by how much, and since when
    (wall-clock seconds)."""

    model_config = ConfigDict(extra="forbid")

    k: int = Field(ge=0)
    cell_from: int = Field(ge=1)  # the cell's first batch size
    factor: float = Field(gt=1.0, allow_inf_nan=False)
    since: float = Field(allow_inf_nan=False)


class TriedRecord(BaseModel):
    """When a trial last took a k at a batch cell (daemon.trial; wall-clock seconds): no trial
    takes it there again within ``DECISION__TRIAL_RETRY_S``."""

    model_config = ConfigDict(extra="forbid")

    k: int = Field(ge=0)
    cell_from: int = Field(ge=1)  # the cell's first batch size
    at: float = Field(allow_inf_nan=False)


class ReplicaRecord(BaseModel):
    """The tables the daemon pushed to one replica."""

    model_config = ConfigDict(extra="forbid")

    pushed: list[list[int]] | None = None
    previous: list[list[int]] | None = None  # what ran before ``pushed`` (rollback target)
    version: int | None = None  # last version seen on the replica
    pushed_at: float | None = None
    # A trial in force when the state was saved: a restarted daemon settles it instead of
    # taking the trial's table for its own.
    trial: TrialRecord | None = None
    # The k it holds to their runs: a restarted daemon does not push them again on their bursts.
    oversold: list[OversoldRecord] = Field(default_factory=list)
    # When each k was last tried where: a restarted daemon does not try it there again yet.
    tried: list[TriedRecord] = Field(default_factory=list)


class DaemonState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    kind: Literal["tabletune.daemon-state"] = "tabletune.daemon-state"
    saved_at: float = 0.0
    last_evaluation: float | None = None  # end of the last interval counted (Prometheus)
    units: dict[str, UnitRecord] = Field(default_factory=dict)
    replicas: dict[str, ReplicaRecord] = Field(default_factory=dict)


class StateStore:
    """Loads and saves ``DaemonState`` in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / STATE_FILE

    def load(self) -> tuple[DaemonState, str | None]:
        """The saved state (or a fresh one) and, if the file was unusable, what was wrong."""
        for leftover in self.directory.glob(f".{STATE_FILE}.*"):
            leftover.unlink(missing_ok=True)  # temp files of writes killed half-way
        if not self.path.exists():
            return DaemonState(), None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return DaemonState.model_validate(data), None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValidationError) as error:
            problem = str(error).splitlines()[0] if str(error) else type(error).__name__
            aside = self.path.with_name(f"{STATE_FILE}.bad-{int(time.time())}")
            try:
                self.path.replace(aside)
            except OSError as move_error:
                return DaemonState(), f"{self.path}: {problem} (could not move aside: {move_error})"
            return DaemonState(), f"{self.path}: {problem}; moved aside to {aside.name}"

    def save(self, state: DaemonState) -> None:
        save_model(state, self.path, mode=self._mode())

    def _mode(self) -> int:
        """The file's own mode (an operator may have widened it), else owner-only: the state
        names every replica and the tables pushed."""
        try:
            return stat.S_IMODE(self.path.stat().st_mode)
        except FileNotFoundError:
            return STATE_FILE_MODE
