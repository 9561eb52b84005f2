"""Per-step cost of the plugin's hooks, on this CPU (no GPU, no vLLM needed).

Engine side: what the scheduler pays per step for ``dynamic_sd_lookup[B]`` -- vLLM's plain list
vs the ``StepPolicy`` installed when exploration and/or hysteresis are on. API side: what the
stat logger's ``record`` costs per step (per-position counters, two histograms).

    .venv/bin/python bench/plugin_step_cost.py [--out bench/results/plugin_step_cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from tabletune import __version__
from tabletune.plugin.metrics import make_stat_logger_class
from tabletune.plugin.policy import StepPolicy
from tabletune.schemas.table import dense_lookup

TABLE = ((1, 64, 3), (65, 128, 1), (129, 256, 2))
MAX_SEQS, K = 256, 3


def per_call_ns(step: Callable[[], object], calls: int, repeats: int) -> dict[str, float]:
    """Median and min over ``repeats`` of the mean time per call, loop overhead subtracted."""

    def empty() -> None:
        return None

    def timed(fn: Callable[[], object]) -> float:
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        return (time.perf_counter_ns() - start) / calls

    samples = [timed(step) - timed(empty) for _ in range(repeats)]
    return {"median_ns": statistics.median(samples), "min_ns": min(samples)}


def lookup_cases(calls: int, repeats: int) -> dict[str, dict[str, float]]:
    lookup = dense_lookup(TABLE, MAX_SEQS, K)
    batches = [((i * 37) % MAX_SEQS) + 1 for i in range(1024)]  # wanders across both edges
    results = {}
    cases: dict[str, Any] = {
        "vllm_plain_list": lookup,
        "policy_exploration_50": StepPolicy(lookup, explore_k=K, exploration_interval=50),
        "policy_hysteresis_8": StepPolicy(lookup, explore_k=K, hysteresis=8),
        "policy_both": StepPolicy(lookup, explore_k=K, exploration_interval=50, hysteresis=8),
    }
    for name, table in cases.items():
        state = {"i": 0}

        def step(table: Any = table, state: dict[str, int] = state) -> object:
            state["i"] = (state["i"] + 1) & 1023
            return table[batches[state["i"]]]

        results[name] = per_call_ns(step, calls, repeats)
    return results


@dataclass
class Spec:
    num_drafts: int
    num_draft_tokens: int
    num_draft_tokens_per_pos: list[int] = field(default_factory=list)


def record_cases(calls: int, repeats: int) -> dict[str, dict[str, float]]:
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(
            num_speculative_tokens=K, num_speculative_tokens_per_batch_size=[list(r) for r in TABLE]
        ),
        model_config=SimpleNamespace(served_model_name="bench"),
    )
    results = {}
    for batch in (1, 64, 256):
        logger = make_stat_logger_class(object, CollectorRegistry())(config, 0)
        scheduler = SimpleNamespace(spec_decoding_stats=Spec(batch, batch * K, [batch] * K))
        iteration = SimpleNamespace(
            inter_token_latencies_iter=[0.008] * batch, time_to_first_tokens_iter=[]
        )
        results[f"stat_logger_record_B{batch}"] = per_call_ns(
            lambda logger=logger, s=scheduler, it=iteration: logger.record(s, it),
            calls // 10,
            repeats,
        )
    return results


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/plugin_step_cost.json")
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    result = {
        "what": "per-step cost of the plugin's hooks (ns per scheduler step / per record call)",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": f"CPU: {cpu_name()} ({os.cpu_count()} cores, shared with other jobs)",
        "engine_version": "n/a (pure Python parts; vLLM 0.26 calls them once per step)",
        "python": platform.python_version(),
        "tabletune_version": __version__,
        "table": [list(r) for r in TABLE],
        "engine_side_lookup": lookup_cases(args.calls, args.repeats),
        "api_side_record": record_cases(args.calls, args.repeats),
        "command": "python bench/plugin_step_cost.py",
    }
    with open(args.out, "w") as out:
        json.dump(result, out, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
