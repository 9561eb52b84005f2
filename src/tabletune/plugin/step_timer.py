"""Times every engine step from the scheduler's per-step callback and counts it in its cell. Pure.

vLLM's engine core calls ``Scheduler.update_from_output(scheduler_output, ...)`` exactly once
per executed step, in step order, on the engine thread (engine.py wraps it and hands the step's
fields and the clock here). With async scheduling (on by default with EAGLE) step N+1 is already
running when the call for step N returns, so the time between two consecutive calls is the time
the engine took for the later step: that step's duration, under the traffic actually served.

What a step is (read from ``SchedulerOutput``, no loop over requests in Python):
- batch size B = ``len(num_scheduled_tokens)``: every scheduled request, prefills included,
  exactly the B vLLM reads ``dynamic_sd_lookup[B]`` with;
- k = the longest list in ``scheduled_spec_decode_tokens`` (0 when empty): the drafts this step
  verified. With async scheduling the lookup read at step N sets the drafts verified at step
  N+1, so the k a step paid for comes from its scheduled drafts, not from the lookup;
- it decodes when k > 0, or every request scheduled one token (tokens == B), or some request
  scheduled exactly one token; otherwise it only prefilled (no k applies to it).

A decoding step whose k differs from the previous decoding step's is counted apart (a switch
step), not in its cell: on an H200 a lone k=2 step inside a k=3 run took as long as the k=3
steps around it, 47 % more than k=2 steps of a k=2 run (bench/results/live_step_time_h200.json),
so the cells hold what running at a k costs, and switches are counted on their own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tabletune.admin.protocol import StepCellsRead
from tabletune.step_cells import StepCellCounter


@dataclass(frozen=True, slots=True)
class TimedStep:
    """A step that went into its cell: what a per-step learner (the bandit) may learn from."""

    batch_size: int
    k: int
    seconds: float


class StepTimer:
    """The engine side's step clock and counter; ``on_step`` runs once per scheduler step."""

    __slots__ = ("_last", "_last_k", "counter", "enabled", "started_at")

    def __init__(self, *, started_at: float) -> None:
        self.counter = StepCellCounter()
        self.started_at = started_at  # wall time the counts start from (the ``_created``)
        self.enabled = True
        self._last: float | None = None
        self._last_k: int | None = None  # k of the last decoding step timed

    def set_enabled(self, on: bool) -> None:
        """Switch recording on or off; while off nothing is read, and the first step after
        switching back on only starts the clock (the gap is not one step)."""
        self.enabled = on
        if not on:
            self._last = self._last_k = None

    def on_step(
        self,
        now: float,
        num_scheduled_tokens: Mapping[str, int],
        total_tokens: int,
        spec_tokens: Mapping[str, Sequence[int]],
        *,
        idle_after: bool,
    ) -> TimedStep | None:
        """One ``update_from_output`` call: ``now`` is when it began (the step's results were
        ready), ``idle_after`` whether the scheduler had no request left once it returned.
        Returns the step when it went into its cell (None otherwise, and while switched off:
        the caller checks ``enabled`` first).

        A duration counts only when the engine ran back to back: the previous call ran tokens
        and left requests behind. So the first call, a step with no tokens (nothing ran: the
        time to the next step may be waiting), and the first step after the scheduler emptied
        (the gap holds idle time) only start the clock. They are left out of the counts.
        """
        last = self._last
        self._last = None if (total_tokens == 0 or idle_after) else now
        if last is None or total_tokens == 0:
            self._last_k = None
            return None
        batch_size = len(num_scheduled_tokens)
        k = max(map(len, spec_tokens.values())) if spec_tokens else 0
        if not (k or total_tokens == batch_size or 1 in num_scheduled_tokens.values()):
            self.counter.record_without_decode()
            return None
        previous_k, self._last_k = self._last_k, k
        if previous_k is not None and previous_k != k:
            self.counter.record_switch(now - last)
            return None
        self.counter.record(batch_size=batch_size, k=k, duration_s=now - last, tokens=total_tokens)
        return TimedStep(batch_size, k, now - last)

    def to_wire(self) -> dict[str, Any]:
        """What the ``tabletune_get_step_cells`` utility answers (plain, msgpack-safe)."""
        return self.read().to_wire()

    def read(self) -> StepCellsRead:
        """The counts now (a conditional table PUT decides on them; ``to_wire`` sends them)."""
        counter = self.counter
        return StepCellsRead(
            counter.totals(),
            counter.steps_without_decode,
            self.started_at,
            counter.switch_steps,
            counter.switch_seconds,
        )
