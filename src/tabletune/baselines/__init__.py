"""Per-step draft-length policies to compare TableTune against (pure; may import the solver).

Each is labelled "-style": it follows its paper's description as far as the emulator can express
it (see docs/results.md for what was followed and what was left out).
"""

from tabletune.baselines.linear_model import LinearStepModel
from tabletune.baselines.nightjar import NightjarStylePolicy, UcbBandit
from tabletune.baselines.policy import FixedKPolicy, Policy, StepOutcome, TablePolicy
from tabletune.baselines.turbospec import TurboSpecStylePolicy, expected_tokens_iid

__all__ = [
    "FixedKPolicy",
    "LinearStepModel",
    "NightjarStylePolicy",
    "Policy",
    "StepOutcome",
    "TablePolicy",
    "TurboSpecStylePolicy",
    "UcbBandit",
    "expected_tokens_iid",
]
