"""AcceptanceProfile: a_1..a_K (probability that the first i guesses are all accepted)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ACCEPTANCE_SCHEMA_VERSION: Literal[1] = 1


class AcceptanceProfile(BaseModel):
    """Measured (or assumed) acceptance, the prior the daemon starts from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = ACCEPTANCE_SCHEMA_VERSION
    kind: Literal["tabletune.acceptance"] = "tabletune.acceptance"
    rates: tuple[float, ...] = Field(
        description="a_i for i=1..K: probability that the first i guesses are all accepted",
        min_length=1,
    )
    num_drafts: int = Field(default=0, ge=0, description="drafts behind the rates (0: assumed)")
    accepted_per_pos: tuple[int, ...] | None = Field(
        default=None, description="accepted tokens per position behind the rates"
    )
    temperature: float | None = Field(default=None, ge=0)
    prompt_source: str = Field(default="unspecified", description="where the prompts came from")
    model: str | None = None
    drafter: str | None = None
    method: str | None = None
    created_at: datetime | None = None
    notes: str = ""

    @model_validator(mode="after")
    def _check(self) -> AcceptanceProfile:
        for i, a in enumerate(self.rates, start=1):
            if not 0.0 <= a <= 1.0:
                raise ValueError(f"rates[{i - 1}] (a_{i}) = {a} is outside [0, 1]")
        for i in range(1, len(self.rates)):
            if self.rates[i] > self.rates[i - 1] + 1e-12:
                raise ValueError(
                    f"rates must be non-increasing (a_{i + 1}={self.rates[i]} > "
                    f"a_{i}={self.rates[i - 1]}): a_i is the chance that the first i "
                    "guesses are ALL accepted"
                )
        if self.accepted_per_pos is not None and len(self.accepted_per_pos) != len(self.rates):
            raise ValueError("accepted_per_pos must have one count per rate")
        return self

    @property
    def max_k(self) -> int:
        return len(self.rates)
