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
  verified, those the lookup asked for when the step before was scheduled (async scheduling);
- it decodes when k > 0, or every request scheduled one token (tokens == B), or some request
  scheduled exactly one token; otherwise it only prefilled (no k applies to it).

A step's time follows the drafts it makes more than those it verifies: while step N runs, the
drafter proposes step N+1's drafts, as many as the lookup said when N was scheduled
(``SchedulerOutput.num_spec_tokens_to_schedule``). On an H200 at B≈254 a step verifying k=0 and
drafting 3 took 40.9 ms, as a k=3 step of a k=3 run (41.6), and one verifying 3 and drafting 0
took 16.0 ms, near a k=0 step (14.0) (bench/results/step_trace_decode_heavy_h200.json). So a
decoding step counts in the cell of k only when it drafts k for the next step too: a step that
drafts another k than it verified (a switch step) is counted apart, so the cells hold what
running at a k costs. Counting the first step verifying a new k apart instead, as this did
before, filed the step before a neighbour burst (verify the running k, draft the burst's) in the
running k's cell and the burst's last step (draft the running k again) in the burst's: at B≈254
a k=3 burst then read 16 % faster than k=3 ran, and k=0's own cell slower than it ran.
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

    __slots__ = ("_last", "counter", "enabled", "started_at")

    def __init__(self, *, started_at: float) -> None:
        self.counter = StepCellCounter()
        self.started_at = started_at  # wall time the counts start from (the ``_created``)
        self.enabled = True
        self._last: float | None = None

    def set_enabled(self, on: bool) -> None:
        """Switch recording on or off; while off nothing is read, and the first step after
        switching back on only starts the clock (the gap is not one step)."""
        self.enabled = on
        if not on:
            self._last = None

    def on_step(
        self,
        now: float,
        num_scheduled_tokens: Mapping[str, int],
        total_tokens: int,
        spec_tokens: Mapping[str, Sequence[int]],
        *,
        idle_after: bool,
        drafts_next: int,
    ) -> TimedStep | None:
        """One ``update_from_output`` call: ``now`` is when it began (the step's results were
        ready), ``idle_after`` whether the scheduler had no request left once it returned,
        ``drafts_next`` the drafts the step made for the next one (the lookup's k when it was
        scheduled). Returns the step when it went into its cell (None otherwise, and while
        switched off: the caller checks ``enabled`` first).

        A duration counts only when the engine ran back to back: the previous call ran tokens
        and left requests behind. So the first call, a step with no tokens (nothing ran: the
        time to the next step may be waiting), and the first step after the scheduler emptied
        (the gap holds idle time) only start the clock. They are left out of the counts.
        """
        last = self._last
        self._last = None if (total_tokens == 0 or idle_after) else now
        if last is None or total_tokens == 0:
            return None
        batch_size = len(num_scheduled_tokens)
        k = max(map(len, spec_tokens.values())) if spec_tokens else 0
        if not (k or total_tokens == batch_size or 1 in num_scheduled_tokens.values()):
            self.counter.record_without_decode()
            return None
        if drafts_next != k:
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
