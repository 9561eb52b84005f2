"""Speculative-decoding counters from vLLM's /metrics text (pure; the fetch lives elsewhere).

vLLM 0.26 publishes per engine (labels ``engine``, ``model_name``): drafts, draft tokens,
accepted tokens and accepted tokens per 0-based ``position``. Engines are summed.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from tabletune.metric_names import (
    LABEL_POSITION,
    VLLM_ACCEPTED_PER_POS,
    VLLM_NUM_ACCEPTED_TOKENS,
    VLLM_NUM_DRAFT_TOKENS,
    VLLM_NUM_DRAFTS,
)
from tabletune.profiler.errors import MeasurementError


@dataclass(frozen=True)
class SpecCounters:
    """Totals since engine start; subtract two snapshots for a window."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_pos: tuple[float, ...] = ()

    def minus(self, earlier: SpecCounters) -> SpecCounters:
        width = max(len(self.accepted_per_pos), len(earlier.accepted_per_pos))
        mine = list(self.accepted_per_pos) + [0.0] * (width - len(self.accepted_per_pos))
        theirs = list(earlier.accepted_per_pos) + [0.0] * (width - len(earlier.accepted_per_pos))
        return SpecCounters(
            drafts=self.drafts - earlier.drafts,
            draft_tokens=self.draft_tokens - earlier.draft_tokens,
            accepted_tokens=self.accepted_tokens - earlier.accepted_tokens,
            accepted_per_pos=tuple(a - b for a, b in zip(mine, theirs, strict=True)),
        )


def _base(name: str) -> str:
    return name.removesuffix("_total")


def parse_spec_counters(text: str) -> SpecCounters:
    """Sum the spec-decode counters over engines; absent counters read as 0 (no spec yet)."""
    totals = {VLLM_NUM_DRAFTS: 0.0, VLLM_NUM_DRAFT_TOKENS: 0.0, VLLM_NUM_ACCEPTED_TOKENS: 0.0}
    per_pos: dict[int, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as error:
        raise MeasurementError(f"/metrics is not Prometheus text: {error}") from None
    for family in families:
        name = _base(family.name)
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue  # skip _created samples
            if name in totals:
                totals[name] += sample.value
            elif name == VLLM_ACCEPTED_PER_POS:
                position = int(sample.labels.get(LABEL_POSITION, "-1"))
                if position < 0:
                    raise MeasurementError(f"{sample.name} without a {LABEL_POSITION} label")
                per_pos[position] = per_pos.get(position, 0.0) + sample.value
    width = max(per_pos) + 1 if per_pos else 0
    return SpecCounters(
        drafts=totals[VLLM_NUM_DRAFTS],
        draft_tokens=totals[VLLM_NUM_DRAFT_TOKENS],
        accepted_tokens=totals[VLLM_NUM_ACCEPTED_TOKENS],
        accepted_per_pos=tuple(per_pos.get(i, 0.0) for i in range(width)),
    )
