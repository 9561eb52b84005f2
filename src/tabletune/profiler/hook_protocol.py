"""What the profiler asks its engine hook: which rejection sampler to run (pure, no vLLM)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tabletune.errors import InputError

HOOK_METHOD = "tabletune_profiler_set_sampler"
"""the worker method the hook adds, reached through vLLM's /collective_rpc (dev mode)"""


@dataclass(frozen=True)
class SamplerMode:
    """``standard``: vLLM's probabilistic rejection sampler (serving); ``synthetic``: accept
    position i with unconditional probability rates[i] (all zeros: every guess rejected)."""

    kind: Literal["standard", "synthetic"]
    rates: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind == "synthetic":
            if not self.rates:
                raise InputError("synthetic sampler needs one rate per position")
            if any(not 0.0 <= r <= 1.0 for r in self.rates):
                raise InputError(f"synthetic rates must be in [0, 1]: {list(self.rates)}")
            if any(b > a for a, b in zip(self.rates, self.rates[1:], strict=False)):
                raise InputError(f"synthetic rates must be non-increasing: {list(self.rates)}")
        elif self.rates:
            raise InputError("the standard sampler takes no rates")

    @classmethod
    def rejecting_all(cls, num_speculative_tokens: int) -> SamplerMode:
        return cls("synthetic", (0.0,) * num_speculative_tokens)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "rates": list(self.rates)}

    @classmethod
    def from_json(cls, data: object) -> SamplerMode:
        if not isinstance(data, dict) or data.get("kind") not in ("standard", "synthetic"):
            raise InputError(f"not a sampler mode: {data!r}")
        rates = data.get("rates") or []
        if not isinstance(rates, list) or not all(isinstance(r, int | float) for r in rates):
            raise InputError(f"rates must be a list of numbers: {rates!r}")
        return cls(data["kind"], tuple(float(r) for r in rates))

    def speculative_config(self) -> dict[str, Any]:
        """The keys of vLLM's --speculative-config that start an engine in this mode."""
        if self.kind == "standard":
            return {"rejection_sample_method": "standard"}
        return {
            "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": list(self.rates),
        }


def conditional_rates(rates: tuple[float, ...]) -> list[float]:
    """vLLM's early-terminating loop takes c_i = p_i / p_{i-1} (vllm.v1.spec_decode.utils)."""
    previous = 1.0
    out = []
    for p in rates:
        out.append(p / previous if previous > 0.0 else 0.0)
        previous = p
    return out
