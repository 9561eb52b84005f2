"""Per-step draft-length decision: the table, plus exploration, neighbour exploration and edge
hysteresis. Pure.

vLLM 0.26's scheduler reads ``Scheduler.dynamic_sd_lookup[batch_size]`` exactly once per
scheduled step (``Scheduler.schedule``). Installing a ``StepPolicy`` there instead of the plain
dense list makes both behaviours act per step without patching vLLM code: the read *is* the hook.
With all off the engine side installs a plain list, so the default costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def hysteresis_masks(lookup: Sequence[int], hysteresis: int) -> tuple[int, ...]:
    """For each batch size b, a bit mask of the k the table uses within ``hysteresis`` of b.

    Bit k of ``masks[b]`` is set when some b' with ``|b - b'| <= hysteresis`` has
    ``lookup[b'] == k``. Index 0 (unused by vLLM) maps to 0. O(len * distinct k).
    """
    size = len(lookup)
    masks = [0] * size
    if size <= 1:
        return tuple(masks)
    for k in set(lookup[1:]):
        # Distance from each b to the nearest b' holding k, left pass then right pass.
        distance = [size] * size
        last = -size
        for b in range(1, size):
            if lookup[b] == k:
                last = b
            distance[b] = b - last
        last = 2 * size
        for b in range(size - 1, 0, -1):
            if lookup[b] == k:
                last = b
            distance[b] = min(distance[b], last - b)
        bit = 1 << k
        for b in range(1, size):
            if distance[b] <= hysteresis:
                masks[b] |= bit
    return tuple(masks)


def neighbour_table(
    allowed_k: Iterable[int], ks: Iterable[int], chosen: Iterable[int] = ()
) -> dict[int, tuple[int, ...]]:
    """For each k of ``ks``: the lengths its bursts run in turn. Without ``chosen``: its
    neighbours among ``allowed_k``, next-lower first, then next-higher (either may be missing;
    none when k is the only allowed length). With ``chosen`` (the daemon's pick): those other
    than k, nearest first (lower first on a tie)."""
    allowed = sorted(set(allowed_k))
    picked = sorted(set(chosen))
    out = {}
    for k in set(ks):
        if picked:
            out[k] = tuple(sorted((a for a in picked if a != k), key=lambda a: (abs(a - k), a)))
            continue
        lower = [a for a in allowed if a < k]
        higher = [a for a in allowed if a > k]
        out[k] = (*lower[-1:], *higher[:1])
    return out


class StepPolicy:
    """Stands in for vLLM's dense lookup: ``policy[batch_size]`` is the k for this step.

    - Exploration (``exploration_interval`` N > 0): every N-th step runs at ``explore_k`` (the
      longest captured k), so positions above the table's k keep being observed.
    - Neighbour exploration (``neighbour_interval`` N2 > 0): every N2-th step that is not an
      exploration step starts a burst of ``neighbour_burst`` steps at an allowed k next to the
      table's k, alternating next-lower and next-higher (the one that exists where there is
      one), so the live step time of the k the table does not use keeps being measured next to
      the one it does. A burst rather than one step: a step drafting another k than it verified
      (the one before the burst, and its last) is not what running at either costs (the step
      timer counts it apart); the burst's other steps are.
    - Hysteresis (h > 0): keep the k of the previous step while the batch size is within h of a
      batch size where the table uses that k, so a load hovering at an edge does not flip k.

    Exploration and neighbour steps never become hysteresis's previous k. Each read counts as
    one scheduled step; only the scheduler's single read per step may use it.
    """

    __slots__ = (
        "_burst",
        "_burst_k",
        "_burst_left",
        "_explore_k",
        "_interval",
        "_last",
        "_lookup",
        "_masks",
        "_neighbour_interval",
        "_neighbours",
        "_previous_k",
        "exploration_steps",
        "neighbour_steps",
        "steps",
    )

    def __init__(
        self,
        lookup: Sequence[int],
        *,
        explore_k: int,
        exploration_interval: int = 0,
        hysteresis: int = 0,
        neighbour_interval: int = 0,
        neighbour_burst: int = 1,
        neighbour_ks: Iterable[int] = (),
        allowed_k: Iterable[int] = (),
        steps: int = 0,
        previous_k: int | None = None,
    ) -> None:
        if len(lookup) < 2:
            raise ValueError("lookup must cover batch size 1 (index 0 is unused)")
        if exploration_interval < 0 or hysteresis < 0 or neighbour_interval < 0:
            raise ValueError("exploration_interval, hysteresis, neighbour_interval must be >= 0")
        if neighbour_burst < 1:
            raise ValueError("neighbour_burst must be >= 1")
        allowed = frozenset(allowed_k)
        if neighbour_interval and not allowed:
            raise ValueError("neighbour exploration needs the allowed k")
        self._lookup = tuple(lookup)
        self._last = len(lookup) - 1
        self._explore_k = explore_k
        self._interval = exploration_interval
        self._masks = hysteresis_masks(self._lookup, hysteresis) if hysteresis else None
        self._neighbour_interval = neighbour_interval
        self._burst = neighbour_burst
        self._burst_k = 0
        self._burst_left = 0
        self._neighbours = neighbour_table(allowed, {*self._lookup[1:], *allowed}, neighbour_ks)
        self._previous_k = previous_k
        self.steps = steps
        self.exploration_steps = 0
        self.neighbour_steps = 0

    def __len__(self) -> int:
        return len(self._lookup)

    def __getitem__(self, batch_size: int) -> int:
        b = batch_size if 1 <= batch_size <= self._last else max(1, min(batch_size, self._last))
        self.steps += 1
        k = self._lookup[b]
        previous = self._previous_k
        if (
            self._masks is not None
            and previous is not None
            and previous != k
            and (self._masks[b] >> previous) & 1
        ):
            k = previous
        self._previous_k = k
        if self._burst_left:  # a burst runs to its end (an exploration step may wait)
            self._burst_left -= 1
            self.neighbour_steps += 1
            return self._burst_k
        if self._interval and self.steps % self._interval == 0 and k != self._explore_k:
            self.exploration_steps += 1
            return self._explore_k
        if self._neighbour_interval and self.steps % self._neighbour_interval == 0:
            neighbours = self._neighbours[k]
            if neighbours:
                # Alternate: even-numbered neighbour steps take the first (lower where there is
                # one), odd ones the last (higher where there is one).
                bursts = self.neighbour_steps // self._burst
                pick = neighbours[bursts % len(neighbours)]
                self.neighbour_steps += 1
                self._burst_k, self._burst_left = pick, self._burst - 1
                return pick
        return k

    @property
    def previous_k(self) -> int | None:
        return self._previous_k

    @property
    def lookup(self) -> tuple[int, ...]:
        return self._lookup

    def table_k(self, batch_size: int) -> int:
        """The table's own k (no exploration, no hysteresis, no step counted)."""
        return self._lookup[max(1, min(batch_size, self._last))]
