"""The fix for vLLM 0.26.0's start-up crash, as a pure wrapper (engine.py applies it).

V2 model runner + a batch-size table + an EAGLE drafter: ``CudaGraphManager._init_candidates``
expands the decode query lengths by the table's k for *every* graph manager. The drafter's
decode manager has query length 1, so ``k + (1 - K)`` is <= 0 and ``round_up(n, 0)`` raises
ZeroDivisionError. The expansion is meant for the target model only; a manager whose
``decode_query_len <= num_speculative_tokens`` cannot verify drafts, so it skips it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

PATCHED_MARK = "_tabletune_compat"


def is_affected_version(version: str) -> bool:
    """Only vLLM 0.26.x carries the bug this wraps (other versions: leave vLLM alone)."""
    parts = version.split(".")
    return len(parts) >= 2 and parts[0] == "0" and parts[1] == "26"


def skips_table_expansion(manager: Any) -> bool:
    """True for a graph manager that must not expand its query length by the table."""
    vllm_config = manager.vllm_config
    spec = vllm_config.speculative_config
    return (
        spec is not None
        and spec.num_speculative_tokens_per_batch_size is not None
        and manager.decode_query_len <= vllm_config.num_speculative_tokens
    )


def wrap_init_candidates(original: Callable[[Any], None]) -> Callable[[Any], None]:
    """``_init_candidates`` that hides the table from the managers it does not apply to."""
    if getattr(original, PATCHED_MARK, False):
        return original  # general plugins may load more than once per process

    @wraps(original)
    def init_candidates(self: Any) -> None:
        if not skips_table_expansion(self):
            original(self)
            return
        # Start-up is single-threaded here (graph managers are built in the runner's __init__);
        # the table is hidden for this one call and always restored.
        spec = self.vllm_config.speculative_config
        table = spec.num_speculative_tokens_per_batch_size
        spec.num_speculative_tokens_per_batch_size = None
        try:
            original(self)
        finally:
            spec.num_speculative_tokens_per_batch_size = table

    setattr(init_candidates, PATCHED_MARK, True)
    return init_candidates
