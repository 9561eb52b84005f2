"""a^prior from vLLM's counters: run the longest K over a prompt set, a_i = accepted_i / drafts
(one run covers every shorter k: a_i is the chance that the first i guesses are all accepted)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from tabletune.profiler.engine import EngineHttp
from tabletune.profiler.errors import MeasurementError
from tabletune.profiler.metrics import SpecCounters
from tabletune.profiler.progress import Reporter
from tabletune.profiler.prompts import Prompt
from tabletune.profiler.settings import AcceptanceSettings
from tabletune.schemas.acceptance import AcceptanceProfile


def rates_from_counters(delta: SpecCounters, num_speculative_tokens: int) -> tuple[float, ...]:
    """a_1..a_K from a window of counters taken with k = K everywhere."""
    if delta.drafts <= 0:
        raise MeasurementError("no drafts during the acceptance run: is speculation on?")
    expected = num_speculative_tokens * delta.drafts
    if abs(delta.draft_tokens - expected) > 1e-6 * max(1.0, expected):
        raise MeasurementError(
            f"drafts held {delta.draft_tokens / delta.drafts:.3f} tokens on average, not "
            f"K={num_speculative_tokens}: the table did not hold K at every batch size, so "
            "accepted_i / drafts would not be a_i"
        )
    per_pos = list(delta.accepted_per_pos) + [0.0] * num_speculative_tokens
    return tuple(per_pos[i] / delta.drafts for i in range(num_speculative_tokens))


def chunks(items: Sequence[Prompt], size: int) -> list[list[Prompt]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def measure_acceptance(
    engine: EngineHttp,
    *,
    prompts: Sequence[Prompt],
    prompt_source: str,
    num_speculative_tokens: int,
    max_num_seqs: int,
    settings: AcceptanceSettings,
    reporter: Reporter,
    model: str | None,
    drafter: str | None,
    method: str | None,
) -> AcceptanceProfile:
    engine.set_k_everywhere(num_speculative_tokens, max_num_seqs)
    batches = chunks(prompts, max(1, min(settings.concurrency, max_num_seqs)))
    reporter.phase("acceptance", len(batches))
    before = engine.counters()
    for batch in batches:
        engine.complete(batch, max_tokens=settings.max_tokens, temperature=settings.temperature)
        reporter.advance(f"{len(batch)} prompts")
    delta = engine.counters().minus(before)
    reporter.done()
    rates = rates_from_counters(delta, num_speculative_tokens)
    sampler = (
        f"synthetic rates {list(settings.synthetic_rates)} (test mode)"
        if settings.synthetic_rates
        else "the serving (standard) rejection sampler"
    )
    return AcceptanceProfile(
        rates=rates,
        num_drafts=round(delta.drafts),
        accepted_per_pos=tuple(
            round(v)
            for v in (list(delta.accepted_per_pos) + [0.0] * num_speculative_tokens)[
                :num_speculative_tokens
            ]
        ),
        temperature=settings.temperature,
        prompt_source=prompt_source,
        model=model,
        drafter=drafter,
        method=method,
        created_at=datetime.now(UTC),
        notes=(
            f"{len(prompts)} prompts x {settings.max_tokens} tokens at k=K={num_speculative_tokens}"
            f" everywhere, {sampler}"
        ),
    )
