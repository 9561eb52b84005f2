"""The in-flight method's plan and bookkeeping, pure: the k order of each repeat, the requests
kept running (groups sent together), their contexts, and when to add requests or start over.

Batch sizes are visited in increasing order; going up adds requests. Every request is given
an output long enough never to end by itself before it is replaced, and is replaced (all of
them, by B fresh ones) before the oldest one's context would pass ``max_context``: contexts stay
short, as a pure-decode prior needs, and a group is never cut short in the middle of a window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tabletune.errors import InputError
from tabletune.profiler.settings import InFlightSettings
from tabletune.step_cells import CellTotals

OUTPUT_MARGIN = 64
"""output tokens beyond max_context: a request outlives the step its context passes the cap"""
SWITCH_TAIL_STEPS = 1
"""steps between setting k and the first one counted at it: the one that drafts the new k while
verifying the old (a switch step, apart; the plugin left out the first step verifying the new k
instead until 2026-12-02, and this was 2)"""


def k_orders(ks: Sequence[int], repeats: int) -> list[tuple[int, ...]]:
    """The k order of each repeat at one batch size: rotated by one per repeat, so every k
    comes first, last and in between in turn (a drift inside a batch size favours none)."""
    if not ks or repeats < 1:
        raise InputError("need at least one k and one repeat")
    n = len(ks)
    return [tuple(ks[(r + i) % n] for i in range(n)) for r in range(repeats)]


@dataclass(frozen=True)
class Group:
    """Requests sent in one completion request: same prompt length, sent together."""

    size: int
    prompt_tokens: int
    sent_at_step: float
    """the engine's step count when they were sent (each later step adds one token each)"""

    def context_at(self, engine_steps: float) -> float:
        return self.prompt_tokens + max(0.0, engine_steps - self.sent_at_step)


@dataclass(frozen=True)
class Holding:
    """The requests kept decoding."""

    groups: tuple[Group, ...] = ()

    @property
    def running(self) -> int:
        return sum(g.size for g in self.groups)

    def with_group(self, group: Group) -> Holding:
        return Holding((*self.groups, group))

    def mean_context(self, engine_steps: float) -> float:
        """Mean context over the requests at this step count (an estimate: a request's first
        token comes a step or two after it was sent)."""
        if not self.groups:
            return 0.0
        total = sum(g.size * g.context_at(engine_steps) for g in self.groups)
        return total / self.running

    def oldest_context(self, engine_steps: float) -> float:
        return max((g.context_at(engine_steps) for g in self.groups), default=0.0)


Action = Literal["keep", "add", "fresh"]


def next_action(
    holding: Holding,
    batch: int,
    engine_steps: float,
    *,
    coming_steps: int,
    max_context: int,
) -> Action:
    """What to do before the next window at ``batch``, which will run about ``coming_steps``:
    start over with ``batch`` fresh requests when there are none, too many, or the oldest would
    pass ``max_context``; add requests when there are too few; else keep them."""
    if holding.running == 0 or holding.running > batch:
        return "fresh"
    if holding.oldest_context(engine_steps) + coming_steps > max_context:
        return "fresh"
    return "add" if holding.running < batch else "keep"


def output_tokens(prompt_tokens: int, max_context: int) -> int:
    """max_tokens of a timed request: to max_context and a margin beyond."""
    return max(1, max_context - prompt_tokens) + OUTPUT_MARGIN


def planning_step_s(*, cell_s: float | None, k_s: float | None, latest_s: float) -> float:
    """The step time a window's first read is planned from: the cell's own latest window (the
    previous repeat of this B and k); at a new batch size, the lower of k's latest window (at
    another B) and the latest steps seen (0: none). Too low costs one more read; too high lets
    the window run on (8 steps of a cell with no CUDA graph last as long as 60 of its
    neighbour's)."""
    if cell_s is not None:
        return cell_s
    seen = [s for s in (k_s, latest_s) if s]
    return min(seen, default=0.0)


def wait_for_window(
    totals: CellTotals, *, step_s: float, settings: InFlightSettings, switched: bool
) -> float:
    """With fresh readings (each answered right after the engine's step running when it
    arrives): how long to wait before reading a window that holds ``totals`` so far, to arrive
    in its last step: half a step before it should be full (``window_steps``, or
    ``min_window_steps`` once ``window_max_s`` is reached). Its own mean step time once it has
    steps, else ``step_s``, with the switch's steps first when k was just ``switched``. At least
    ``poll_s``."""
    if totals.steps > 0:
        step_s = totals.mean_s
    if not step_s > 0:
        return settings.poll_s
    by_time = math.ceil((settings.window_max_s - totals.seconds) / step_s)
    left = min(
        settings.window_steps - totals.steps,
        max(settings.min_window_steps - totals.steps, by_time),
    )
    if totals.steps <= 0 and switched:
        left += SWITCH_TAIL_STEPS
    return max(settings.poll_s, (left - 0.5) * step_s)
