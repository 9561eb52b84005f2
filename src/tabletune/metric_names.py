"""Metric names and label conventions shared by the plugin, the emulator, the daemon and the
Prometheus rules. vLLM's own names are listed as vLLM 0.26 publishes them."""

from __future__ import annotations

# Labels vLLM puts on its per-engine series.
LABEL_ENGINE = "engine"
LABEL_MODEL = "model_name"
LABEL_POSITION = "position"  # 0-based draft position, as vLLM labels it

# vLLM 0.26 (counters are exposed with a _total suffix and a _created sample).
VLLM_NUM_DRAFTS = "vllm:spec_decode_num_drafts"
VLLM_NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
VLLM_NUM_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
VLLM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
VLLM_GENERATION_TOKENS = "vllm:generation_tokens"
VLLM_NUM_REQUESTS_RUNNING = "vllm:num_requests_running"

# The TableTune plugin (API-server process, stat-logger plugin).
TT_DRAFT_TOKENS_PER_POS = "tabletune_spec_decode_num_draft_tokens_per_pos"  # counter
TT_TABLE_VERSION = "tabletune_table_version"  # gauge
TT_TABLE_RANGE_K = "tabletune_table_range_k"  # gauge, labels range_start, range_end
TT_EXPLORATION_STEPS = "tabletune_exploration_steps"  # counter
# Per-step timing cells (tabletune.step_cells), counted in the engine core and exported by the
# HTTP side; labels k (verified draft length) and batch (cell label "1".."16", "17-24", ...).
TT_STEPS = "tabletune_steps"  # counter: steps that decoded
TT_STEP_SECONDS = "tabletune_step_seconds"  # counter: sum of their durations
TT_STEP_SECONDS_SQUARED = "tabletune_step_seconds_squared"  # counter: sum of squared durations
TT_STEP_TOKENS = "tabletune_step_scheduled_tokens"  # counter: sum of scheduled tokens
TT_STEP_REQUESTS = "tabletune_step_scheduled_requests"  # counter: sum of batch sizes
TT_STEPS_WITHOUT_DECODE = "tabletune_steps_without_decode"  # counter: prefill-only steps
TT_SWITCH_STEPS = "tabletune_k_switch_steps"  # counter: steps drafting another k than verified
TT_SWITCH_SECONDS = "tabletune_k_switch_step_seconds"  # counter: their durations
LABEL_BATCH = "batch"
LABEL_K = "k"
LABEL_RANGE_START = "range_start"
LABEL_RANGE_END = "range_end"

# vLLM serves /metrics through prometheus_client's content negotiation. Prometheus asks for
# OpenMetrics first, and in that format prometheus_client (seen with 0.26) writes the sample names
# "vllm:..." as "vllm_...", so rules written against vLLM's documented names find nothing. Every
# Prometheus job that scrapes vLLM carries this relabel to restore vLLM's spelling (a no-op when
# the names arrive as "vllm:").
VLLM_NAME_RELABEL: dict[str, object] = {
    "source_labels": ["__name__"],
    "regex": "vllm_(.+)",
    "target_label": "__name__",
    "replacement": "vllm:$1",
}
