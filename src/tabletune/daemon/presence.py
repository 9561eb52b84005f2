"""Which replicas the daemon still remembers, pure: a replica without data for
``LOOP__FORGET_AFTER_S`` (a pod a rolling deploy removed, an engine down for good) is
forgotten, so alerts, metric series and saved state stop growing with every replica ever seen.

A replica's clock starts at its first sight, with or without data (a restored record counts as
seen when the daemon starts) and restarts with every cycle that brings its data. A forgotten
replica that its source still names without data stays forgotten (no new alert for it) until
data comes again; then it starts afresh, like a new one.
"""

from __future__ import annotations

from collections.abc import Iterable


class Presence:
    def __init__(self, *, forget_after_s: float) -> None:
        self.forget_after_s = forget_after_s
        self._since: dict[str, float] = {}  # replica -> its last data (or its first sight)
        self._forgotten: set[str] = set()

    def data(self, replica: str, now: float) -> None:
        self._since[replica] = now
        self._forgotten.discard(replica)

    def seen(self, replica: str, now: float) -> None:
        """Named without data: the clock starts now unless it runs already."""
        if replica not in self._forgotten:
            self._since.setdefault(replica, now)

    def forgotten(self, replica: str) -> bool:
        return replica in self._forgotten

    def due(self, now: float, *, named: Iterable[str]) -> list[str]:
        """The replicas to forget now (sorted). ``named``: every replica the source reported
        this cycle; a forgotten replica it no longer names is no longer remembered at all."""
        gone = sorted(r for r, since in self._since.items() if now - since >= self.forget_after_s)
        for replica in gone:
            del self._since[replica]
        self._forgotten = (self._forgotten | set(gone)) & set(named)
        return gone

    def __len__(self) -> int:
        return len(self._since)
