"""What the daemon remembers about each replica between cycles, and what one cycle reports."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tabletune.admin.protocol import TableView
from tabletune.daemon.decide import Decision
from tabletune.daemon.guard import GoodputHistory, PendingCheck
from tabletune.daemon.loads import LoadTracker
from tabletune.daemon.oversold import Oversold, StoodOn
from tabletune.daemon.profiles import PoolProfile
from tabletune.daemon.state import OversoldRecord, ReplicaRecord, TrialRecord, TriedRecord
from tabletune.daemon.step_time import StepTimeEstimator
from tabletune.daemon.trial import Trial


@dataclass
class ReplicaRuntime:
    """One replica's memory: its table record, load and goodput history, live step time."""

    replica: str
    admin_url: str
    pool: PoolProfile
    record: ReplicaRecord
    loads: LoadTracker
    history: GoodputHistory
    step_time: StepTimeEstimator
    pending: PendingCheck | None = None
    hold_until: float = 0.0  # a rollback holds pushes until then (plan.rollback_hold_until)
    rolled_back_at: float | None = None
    watched_since: float = 0.0  # when this daemon first saw the replica
    needs_decision: bool = True  # first sight, a failed push, a version race, a restart
    view: TableView | None = None
    view_read_at: float = 0.0
    # What the last decision was made from: T_hat / profile per cell, and a_hat.
    decided_ratio: np.ndarray | None = None
    decided_rates: tuple[float, ...] | None = None
    decided_at: float = 0.0
    decided_load: float | None = None  # the load-weighted mean batch size it weighed
    held_back: bool = False  # the last decision kept a gain out as noise: recheck it later
    trial: Trial | None = None  # a trial in force (daemon.trial), until a decision settles it
    # When each (k, first batch size of its cell) was last tried: not again within retry_s
    # (kept in the saved record too: note_tried).
    tried_at: dict[tuple[int, int], float] = field(default_factory=dict)
    # The last push that put a k in where it had not run, until that k's run is read there.
    stood_on: StoodOn | None = None
    # k whose run read slower than the push that put them in stood on (daemon.oversold), kept
    # in the saved record too (set_oversold).
    oversold: Oversold = field(default_factory=dict)

    def __post_init__(self) -> None:
        saved = self.record.trial
        if self.trial is None and saved is not None:  # restored: the trial goes on
            before = tuple((int(s), int(e), int(k)) for s, e, k in saved.before)
            self.trial = Trial(saved.k, saved.batch, before, saved.started_at)
        if not self.oversold:  # restored: what its runs showed still holds
            self.oversold = {(o.k, o.cell_from): (o.factor, o.since) for o in self.record.oversold}
        if not self.tried_at:  # restored: a k tried lately is not tried again yet
            self.tried_at = {(t.k, t.cell_from): t.at for t in self.record.tried}

    def note_tried(self, k: int, cell_from: int, at: float) -> None:
        """A trial took k at the cell starting at ``cell_from``, kept in the saved record too."""
        self.tried_at[(k, cell_from)] = at
        self.record.tried = [
            TriedRecord(k=k, cell_from=low, at=when)
            for (k, low), when in sorted(self.tried_at.items())
        ]

    def set_oversold(self, oversold: Oversold) -> None:
        """The k held to their runs, kept in the saved record too."""
        self.oversold = oversold
        self.record.oversold = [
            OversoldRecord(k=k, cell_from=low, factor=factor, since=since)
            for (k, low), (factor, since) in sorted(oversold.items())
        ]

    def set_trial(self, trial: Trial | None) -> None:
        """The trial in force, kept in the saved record too."""
        self.trial = trial
        self.record.trial = None if trial is None else TrialRecord(
            k=trial.k, batch=trial.batch, before=[list(r) for r in trial.before],
            started_at=trial.started_at,
        )  # fmt: skip


@dataclass
class CycleReport:
    """What one cycle saw and did (for logs, --once, the demo and tests)."""

    started: float
    observed: list[str] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)
    outage: str | None = None
    rebuilt: list[str] = field(default_factory=list)
    decisions: dict[str, Decision] = field(default_factory=dict)
    pushed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)  # no data for forget_after_s
    deferred: list[str] = field(default_factory=list)  # admin calls not sent in time: next cycle
    abandoned: bool = False
