"""Nightjar-style policy (Li et al., arXiv 2512.22420): a multi-armed bandit per batch size.

The paper's planner picks the speculative length for the current batch size with a bandit whose
arms are the lengths, 0 (speculation off) included, rewarded by measured serving performance.
Here: one UCB1 bandit per batch size, arms = allowed k, reward = the step's goodput (kept tokens
per ms) divided by the best step goodput seen at that batch size so far (so rewards lie in (0, 1]
as UCB1 assumes). The KV-cache offload of the draft model is outside the emulator's scope.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from tabletune.baselines.policy import StepOutcome
from tabletune.solver import SolverError

DEFAULT_EXPLORATION = 1.0


class UcbBandit:
    """UCB1 (Auer et al. 2002): play each arm once, then argmax mean + c * sqrt(2 ln n / n_a)."""

    def __init__(self, arms: Iterable[int], *, exploration: float = DEFAULT_EXPLORATION) -> None:
        self.arms = tuple(arms)
        if not self.arms:
            raise SolverError("a bandit needs at least one arm")
        if exploration < 0:
            raise SolverError("exploration must be >= 0")
        self.exploration = exploration
        self.pulls = dict.fromkeys(self.arms, 0)
        self.totals = dict.fromkeys(self.arms, 0.0)

    @property
    def rounds(self) -> int:
        return sum(self.pulls.values())

    def mean(self, arm: int) -> float:
        n = self.pulls[arm]
        return self.totals[arm] / n if n else 0.0

    def select(self) -> int:
        for arm in self.arms:
            if self.pulls[arm] == 0:
                return arm
        log_n = math.log(self.rounds)

        def score(arm: int) -> float:
            return self.mean(arm) + self.exploration * math.sqrt(2.0 * log_n / self.pulls[arm])

        return max(self.arms, key=score)

    def update(self, arm: int, reward: float) -> None:
        self.pulls[arm] += 1
        self.totals[arm] += reward

    def best_arm(self) -> int:
        """The arm with the highest mean reward so far."""
        return max(self.arms, key=self.mean)


class NightjarStylePolicy:
    """One UCB1 bandit per batch-size key (by default the exact batch size)."""

    name = "Nightjar-style"

    def __init__(
        self,
        allowed_k: Iterable[int],
        *,
        exploration: float = DEFAULT_EXPLORATION,
        key: Callable[[int], int] | None = None,
    ) -> None:
        self.allowed_k = tuple(sorted(set(allowed_k)))
        if not self.allowed_k:
            raise SolverError("the allowed set of k is empty")
        if exploration < 0:
            raise SolverError("exploration must be >= 0")
        self.exploration = exploration
        self._key = key if key is not None else (lambda b: b)
        self.bandits: dict[int, UcbBandit] = {}
        self._best_goodput: dict[int, float] = {}

    def bandit(self, batch_size: int) -> UcbBandit:
        key = self._key(batch_size)
        if key not in self.bandits:
            self.bandits[key] = UcbBandit(self.allowed_k, exploration=self.exploration)
        return self.bandits[key]

    def choose_k(self, batch_size: int, step_index: int) -> int:
        return self.bandit(batch_size).select()

    def observe(self, outcome: StepOutcome) -> None:
        self.reward(outcome.batch_size, outcome.k, outcome.goodput)

    def reward(self, batch_size: int, k: int, goodput: float) -> None:
        """Credit ``k`` at this batch size with a step's goodput (any unit, > 0), divided by the
        best seen for the key so far. A step that kept nothing rewards 0."""
        key = self._key(batch_size)
        best = max(self._best_goodput.get(key, 0.0), goodput)
        self._best_goodput[key] = best
        self.bandit(batch_size).update(k, goodput / best if best > 0 else 0.0)
