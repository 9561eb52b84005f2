"""The Nightjar-style per-step policy run in the engine: a UCB1 bandit per batch size picks k at
every step and learns from the step's measured goodput. Pure.

It stands in for vLLM's dense lookup exactly as ``StepPolicy`` does (the scheduler reads
``dynamic_sd_lookup[batch_size]`` once per step: that read is the choice). Its arms are the k
the starting table captured (``allowed_k``); the bandit code is the evaluation baseline's
(``tabletune.baselines.nightjar``), so the in-engine policy and the emulator's comparison
baseline are one piece of code.

Feedback comes from whoever times the steps (the plugin's ``StepTimer``, the emulator's step
cells): ``learn`` is called for each step that went into its step-time cell, with the tokens the
step kept and its duration. Steps that did not (the first step, one after an idle gap, a
prefill-only step, one drafting another k than it verified) teach nothing, by the timer's own rules.
"""

from __future__ import annotations

from collections.abc import Iterable

from tabletune.baselines.nightjar import DEFAULT_EXPLORATION, NightjarStylePolicy


class NightjarLookup:
    """``lookup[batch_size]`` is the k the bandit for that batch size picks for this step.

    Batch sizes beyond 1..``max_num_seqs`` are clamped (vLLM never exceeds max_num_seqs).
    ``steps`` counts the reads (steps whose k the bandit chose), ``rewarded_steps`` the steps
    it learnt from.
    """

    __slots__ = ("_allowed", "_last", "_policy", "rewarded_steps", "steps")

    def __init__(
        self,
        allowed_k: Iterable[int],
        *,
        max_num_seqs: int,
        exploration: float = DEFAULT_EXPLORATION,
    ) -> None:
        if max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        self._policy = NightjarStylePolicy(allowed_k, exploration=exploration)
        self._allowed = frozenset(self._policy.allowed_k)
        self._last = max_num_seqs
        self.steps = 0
        self.rewarded_steps = 0

    def __len__(self) -> int:
        return self._last + 1

    def _clamp(self, batch_size: int) -> int:
        return max(1, min(batch_size, self._last))

    def __getitem__(self, batch_size: int) -> int:
        self.steps += 1
        return self._policy.choose_k(self._clamp(batch_size), self.steps)

    def learn(self, batch_size: int, k: int, kept_tokens: int, seconds: float) -> None:
        """One timed step: ``kept_tokens`` (accepted drafts + one per decoding request) in
        ``seconds``. A k outside the arms (drafts cut short near a request's end) or a step
        without duration teaches nothing."""
        if k not in self._allowed or not seconds > 0 or batch_size < 1:
            return
        self._policy.reward(self._clamp(batch_size), k, max(kept_tokens, 0) / seconds)
        self.rewarded_steps += 1

    def table_k(self, batch_size: int) -> int:
        """The k with the best mean reward at this batch size so far (for display; no step
        counted, no bandit made): the first arm before any reward."""
        bandit = self._policy.bandits.get(self._clamp(batch_size))
        return self._policy.allowed_k[0] if bandit is None else bandit.best_arm()

    @property
    def allowed_k(self) -> tuple[int, ...]:
        return self._policy.allowed_k

    @property
    def exploration(self) -> float:
        return self._policy.exploration
