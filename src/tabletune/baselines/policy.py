"""What a per-step policy sees and says: choose k for a batch, then learn from the step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tabletune.solver import expand


@dataclass(frozen=True)
class StepOutcome:
    """One engine step as the engine reports it (vLLM's counters, per step).

    ``drafted[i]`` / ``accepted[i]``: draft tokens at position i+1 drafted / accepted this step,
    summed over the batch (vLLM counts accepted per position; the plugin adds drafted).
    """

    batch_size: int
    k: int
    step_ms: float
    drafted: tuple[int, ...]
    accepted: tuple[int, ...]

    @property
    def kept_tokens(self) -> int:
        """Tokens the step produced: one bonus/corrected token per request plus accepted ones."""
        return self.batch_size + sum(self.accepted)

    @property
    def goodput(self) -> float:
        """Kept tokens per millisecond of this step."""
        return self.kept_tokens / self.step_ms


class Policy(Protocol):
    """Per-step draft-length choice with feedback (the emulator's ``choose_k`` hook)."""

    name: str

    def choose_k(self, batch_size: int, step_index: int) -> int: ...

    def observe(self, outcome: StepOutcome) -> None: ...


class FixedKPolicy:
    """The same k at every batch size (k=0: no speculation)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.name = "no speculation" if k == 0 else f"fixed k={k}"

    def choose_k(self, batch_size: int, step_index: int) -> int:
        return self.k

    def observe(self, outcome: StepOutcome) -> None:
        return None


class TablePolicy:
    """A static batch-size table, looked up as vLLM does (tail carries the last k)."""

    def __init__(self, ranges: Sequence[tuple[int, int, int]], max_batch: int, name: str) -> None:
        self.lookup = expand(ranges, max_batch)
        self.name = name

    def choose_k(self, batch_size: int, step_index: int) -> int:
        return self.lookup[min(batch_size, len(self.lookup)) - 1]

    def observe(self, outcome: StepOutcome) -> None:
        return None
