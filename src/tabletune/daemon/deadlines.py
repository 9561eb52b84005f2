"""How long one cycle may wait for its replicas, pure (times on the monotonic clock).

A cycle waits for replicas until ``LOOP__CYCLE_BUDGET`` × the interval has passed since it
started, so it always ends before the next one is due and a hung replica never makes the loop
late. Scrapes end at their own timeout or half the budget; admin calls have the rest. A retry
is started only when the try after the wait could still end by the deadline.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CycleBudget:
    started: float
    deadline: float

    @classmethod
    def of(cls, started: float, *, interval_s: float, share: float) -> CycleBudget:
        return cls(started=started, deadline=started + share * interval_s)

    def scrape_deadline(self, timeout_s: float) -> float:
        """When the scrapes end: their timeout, or half the budget if sooner (the rest is for
        the admin calls that follow: a hung scrape must not leave them no time)."""
        return min(self.started + timeout_s, (self.started + self.deadline) / 2)


def try_fits(now: float, *, wait_s: float, attempt_s: float, deadline: float) -> bool:
    """A try that starts ``wait_s`` from ``now`` and takes up to ``attempt_s`` ends in time."""
    return now + wait_s + attempt_s <= deadline
