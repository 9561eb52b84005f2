"""Which replicas the daemon still remembers, pure: a replica without data for
``LOOP__FORGET_AFTER_S`` (a pod a rolling deploy removed, an engine down for good) is
forgotten, so alerts, metric series and saved state stop growing with every replica ever seen.

A replica's clock starts at its first sight, with or without data (a restored record counts as
seen when the daemon starts) and restarts with every cycle that brings its data. A forgotten
replica that its source still names without data stays forgotten (no new alert for it) until
data comes again; then it starts afresh, like a new one.

The clocks run only while the source brings data from some replica: a cycle that brought none
(Prometheus down or restarting, the daemon cut off) is no evidence that any replica left, so the
time up to it does not count (a 60 s Prometheus outage with a 60 s TTL forgot every replica).
"""

from __future__ import annotations

from collections.abc import Iterable


class Presence:
    def __init__(self, *, forget_after_s: float) -> None:
        self.forget_after_s = forget_after_s
        # replica -> its last data (or its first sight), on the sighted clock (``_clock``)
        self._since: dict[str, float] = {}
        self._forgotten: set[str] = set()
        self._blind_s = 0.0  # time up to cycles in which the source brought no data at all
        self._last_cycle: float | None = None

    def cycle(self, now: float, *, source_saw_any: bool) -> None:
        """Once per cycle, first: the time since the last cycle does not count when the source
        brought no data from any replica in this one."""
        if self._last_cycle is not None and not source_saw_any:
            self._blind_s += max(0.0, now - self._last_cycle)
        self._last_cycle = now

    def _clock(self, now: float) -> float:
        return now - self._blind_s

    def data(self, replica: str, now: float) -> None:
        self._since[replica] = self._clock(now)
        self._forgotten.discard(replica)

    def seen(self, replica: str, now: float) -> None:
        """Named without data: the clock starts now unless it runs already."""
        if replica not in self._forgotten:
            self._since.setdefault(replica, self._clock(now))

    def forgotten(self, replica: str) -> bool:
        return replica in self._forgotten

    def due(self, now: float, *, named: Iterable[str]) -> list[str]:
        """The replicas to forget now (sorted). ``named``: every replica the source reported
        this cycle; a forgotten replica it no longer names is no longer remembered at all."""
        clock, ttl = self._clock(now), self.forget_after_s
        gone = sorted(r for r, since in self._since.items() if clock - since >= ttl)
        for replica in gone:
            del self._since[replica]
        self._forgotten = (self._forgotten | set(gone)) & set(named)
        return gone

    def __len__(self) -> int:
        return len(self._since)
