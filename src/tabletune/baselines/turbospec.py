"""TurboSpec-style policy (Liu et al., arXiv 2406.14066, "SmartSpec" in v1, "TurboSpec" in v3).

Each step: predict goodput for every candidate k as (expected kept tokens per request) x B over a
LINEAR step-time model fitted offline to the profile, and draft the argmax. The expected kept
tokens assume each guess is accepted independently with one token acceptance rate alpha (the
paper's model): E[tokens | k] = (1 - alpha^(k+1)) / (1 - alpha). alpha is tracked online as a
moving average of observed acceptance (exponentially decayed counts).
"""

from __future__ import annotations

from collections.abc import Iterable

from tabletune.baselines.linear_model import LinearStepModel
from tabletune.baselines.policy import StepOutcome
from tabletune.solver import SolverError

DEFAULT_DECAY = 0.995  # per observed step: recent ~200 steps dominate
DEFAULT_PRIOR_TRIALS = 200.0


def expected_tokens_iid(alpha: float, k: int) -> float:
    """Kept tokens per request per step with k guesses, each accepted with probability alpha."""
    if not 0.0 <= alpha <= 1.0:
        raise SolverError(f"alpha={alpha} is outside [0, 1]")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class TurboSpecStylePolicy:
    """argmax_k B * E[tokens | k, alpha_hat] / T_linear(B, k), decided every step."""

    name = "TurboSpec-style"

    def __init__(
        self,
        model: LinearStepModel,
        allowed_k: Iterable[int],
        *,
        prior_alpha: float,
        prior_trials: float = DEFAULT_PRIOR_TRIALS,
        decay: float = DEFAULT_DECAY,
    ) -> None:
        self.model = model
        self.allowed_k = tuple(sorted(set(allowed_k)))
        if not self.allowed_k:
            raise SolverError("the allowed set of k is empty")
        if not 0.0 < decay <= 1.0:
            raise SolverError("decay must be in (0, 1]")
        if not 0.0 <= prior_alpha <= 1.0:
            raise SolverError(f"prior alpha={prior_alpha} is outside [0, 1]")
        self.decay = decay
        # Accepted guesses and acceptance trials (guesses that were reached), decayed per step.
        self._accepted = prior_alpha * prior_trials
        self._trials = prior_trials

    @property
    def alpha(self) -> float:
        return self._accepted / self._trials if self._trials > 0 else 0.0

    def predicted_goodput(self, batch_size: int, k: int) -> float:
        return batch_size * expected_tokens_iid(self.alpha, k) / self.model.predict(batch_size, k)

    def choose_k(self, batch_size: int, step_index: int) -> int:
        return max(self.allowed_k, key=lambda k: self.predicted_goodput(batch_size, k))

    def observe(self, outcome: StepOutcome) -> None:
        """Guess i is a trial when guesses 1..i-1 were all accepted (the rest are never
        verified); the maximum-likelihood alpha is accepted / trials."""
        if outcome.k == 0 or not outcome.drafted or outcome.drafted[0] == 0:
            return  # nothing drafted: nothing learnt (the estimate freezes, as in the paper)
        accepted = outcome.accepted[: outcome.k]
        trials = outcome.drafted[0] + sum(
            min(a, d) for a, d in zip(accepted[:-1], outcome.drafted[1 : outcome.k], strict=True)
        )
        self._accepted = self.decay * self._accepted + sum(accepted)
        self._trials = self.decay * self._trials + trials
