"""The traffic shape a profile's step times were taken under, and whether live traffic differs.

A profile is a prior for the step times the engine will run live. Steps cost more when prefill
rides along with decode (more scheduled tokens per step) and when contexts are longer, so a
profile timed on pure decode with short contexts reads low for serving traffic that carries
prefill. The profile records its shape; ``profile_shape_mismatch`` says, from what the
plugin's step cells show live (scheduled tokens per step at a batch size and k), when the live
shape is not the one the profile was timed under. Pure (the daemon and ``tabletune compare``
call it).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

MIN_EXTRA_TOKENS = 16.0
"""prefill tokens per step below this difference never warn (a short prompt now and then)"""
EXTRA_TOKENS_SHARE = 0.1
"""...nor below this share of the step's own decode tokens B * (1 + k)"""
CONTEXT_FACTOR = 2.0
"""contexts within a factor of 2 of the profile's do not warn..."""
MIN_CONTEXT_TOKENS = 256.0
"""...nor any difference below this many tokens"""


class PrefillStream(BaseModel):
    """Background requests that only prefill (one output token each), sent while timing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests_per_s: float = Field(gt=0, description="mean arrival rate (Poisson)")
    prompt_tokens: tuple[int, int] = Field(
        description="inclusive range the prompt lengths are drawn from, uniformly"
    )

    @model_validator(mode="after")
    def _range(self) -> PrefillStream:
        low, high = self.prompt_tokens
        if not 1 <= low <= high:
            raise ValueError(f"prompt_tokens must be a range 1 <= low <= high, got {low}..{high}")
        return self

    @property
    def mean_prompt_tokens(self) -> float:
        return (self.prompt_tokens[0] + self.prompt_tokens[1]) / 2.0


class TimingShape(BaseModel):
    """What the timed steps carried besides B * (1 + k) decode tokens, and their contexts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_tokens: int = Field(ge=1, description="prompt length of the timed requests")
    context_tokens: float | None = Field(
        default=None, ge=0, description="mean context (prompt + generated) over the timed steps"
    )
    extra_tokens_per_step: float = Field(
        default=0.0,
        ge=0,
        description="mean scheduled tokens per timed step beyond B * (1 + k): prefill riding "
        "along (0: pure decode)",
    )
    prefill_stream: PrefillStream | None = Field(
        default=None, description="the background prefill stream timed under, if any"
    )


def profile_shape_mismatch(
    shape: TimingShape | None,
    *,
    k: int,
    live_batch: float,
    live_tokens_per_step: float,
    live_context_tokens: float | None = None,
) -> list[str]:
    """Why the profile's step times do not describe live steps of this shape (empty: they do).

    ``shape`` is the profile's ``metadata.timing_shape`` (None: a profile from before shapes
    were recorded, timed on pure decode with short prompts). ``live_batch`` and
    ``live_tokens_per_step`` are one step cell's mean scheduled requests and tokens per step
    over a window (``tabletune_step_scheduled_requests_total`` and
    ``tabletune_step_scheduled_tokens_total`` over ``tabletune_steps_total``) at draft length
    ``k``; ``live_context_tokens`` the mean context of the requests served, if known.
    """
    if k < 0 or not live_batch > 0 or live_tokens_per_step < 0:
        raise ValueError(
            f"need k >= 0, live_batch > 0, live_tokens_per_step >= 0; got {k}, {live_batch}, "
            f"{live_tokens_per_step}"
        )
    decode_tokens = live_batch * (1 + k)
    live_extra = max(0.0, live_tokens_per_step - decode_tokens)
    timed_extra = shape.extra_tokens_per_step if shape is not None else 0.0
    problems = []
    if abs(live_extra - timed_extra) > max(MIN_EXTRA_TOKENS, EXTRA_TOKENS_SHARE * decode_tokens):
        direction = "more" if live_extra > timed_extra else "fewer"
        problems.append(
            f"live steps at B~{live_batch:.0f}, k={k} carry {live_extra:.0f} prefill tokens per "
            f"step beyond the {decode_tokens:.0f} decode tokens, the profile was timed with "
            f"{timed_extra:.0f}: {direction} tokens per step than profiled, so the profile's "
            f"step times read {'low' if direction == 'more' else 'high'} (profile under this "
            "traffic: tabletune profile --prefill-rate/--prefill-tokens)"
        )
    timed_context = shape.context_tokens if shape is not None else None
    if live_context_tokens is not None and timed_context is not None:
        low, high = sorted((live_context_tokens, timed_context))
        if high > CONTEXT_FACTOR * max(low, 1.0) and high - low > MIN_CONTEXT_TOKENS:
            problems.append(
                f"live contexts average {live_context_tokens:.0f} tokens, the profile's "
                f"{timed_context:.0f} (profile at this context: tabletune profile "
                "--prompt-tokens)"
            )
    return problems
