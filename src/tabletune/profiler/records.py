"""Every raw timing sample as measured, written even when a run stops half-way (then marked
incomplete): the Profile needs a complete grid, this record does not."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tabletune.schemas.profile import ProfileMetadata


class RawSample(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_size: int = Field(ge=1)
    k: int = Field(ge=0)
    short_s: float = Field(description="duration of the 1-token request")
    long_s: float = Field(description="duration of the (1 + decode_tokens)-token request")
    step_ms: float
    round: int = Field(ge=0, description="0: first pass; 1..: re-measurements")


class WindowSample(BaseModel):
    """One in-flight window: the increase of the step cell of (B, k) between two readings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_size: int = Field(ge=1)
    k: int = Field(ge=0)
    round: int = Field(ge=0, description="0: first pass; 1..: re-measurements")
    steps: float
    seconds: float
    seconds_sq: float
    tokens: float = Field(description="scheduled tokens (B*(1+k) per step on pure decode)")
    requests: float = Field(description="scheduled requests (B per step)")
    context_tokens: float = Field(description="mean context of the requests (estimated)")
    step_ms: float = Field(description="seconds / steps, in ms")
    engine_steps: float | None = Field(
        default=None,
        description="every step the engine ran between the window's two readings: its own, "
        "the previous k's last ones and the switch step (None: not recorded, older files)",
    )
    reads: int | None = Field(default=None, description="step readings taken to fill it")
    wall_s: float | None = Field(
        default=None,
        description="wall time from setting its k (or starting its requests) to its last reading",
    )


class RawRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    kind: Literal["tabletune.profile-raw"] = "tabletune.profile-raw"
    metadata: ProfileMetadata
    decode_tokens: int
    prompt_tokens: int
    batch_grid: tuple[int, ...]
    ks: tuple[int, ...]
    timing_method: str = "request"
    samples: list[RawSample] = Field(default_factory=list, description="request method")
    windows: list[WindowSample] = Field(default_factory=list, description="in-flight method")
    cross_check_samples: list[RawSample] = Field(
        default_factory=list, description="the request method on the cross-check cells"
    )
    refused_windows: list[str] = Field(
        default_factory=list, description="in-flight windows taken again, and why"
    )
    incomplete: bool = False
    reason: str = ""
