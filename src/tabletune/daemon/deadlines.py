"""How long one cycle may wait for its replicas, pure (times on the monotonic clock).

A cycle waits for replicas until ``LOOP__CYCLE_BUDGET`` × the interval has passed since it
started, so it always ends before the next one is due and a hung replica never makes the loop
late. Scrapes have the first half of the budget (each request its own timeout too), admin calls
the rest. A retry is started only when the try after the wait could still end by the deadline.
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

    def scrape_deadline(self) -> float:
        """When the wait for scrapes ends: half the budget (each request also ends at its own
        timeout); the rest is for the admin calls that follow."""
        return (self.started + self.deadline) / 2


def try_fits(now: float, *, wait_s: float, attempt_s: float, deadline: float) -> bool:
    """A try that starts ``wait_s`` from ``now`` and takes up to ``attempt_s`` ends in time."""
    return now + wait_s + attempt_s <= deadline
