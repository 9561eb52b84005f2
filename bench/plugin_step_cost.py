"""Per-step cost of the plugin's hooks, on this CPU (no GPU, no vLLM needed).

Engine side: what the scheduler pays per step for ``dynamic_sd_lookup[B]`` -- vLLM's plain list
vs the ``StepPolicy`` installed when exploration, hysteresis and/or neighbour exploration are
on -- and what the step timing adds to each ``Scheduler.update_from_output`` call (the real
wrapper from plugin/engine.py around a no-op, on scheduler outputs shaped as vLLM 0.26 builds
them with async scheduling: one shared placeholder draft list per request). API side: what the
stat logger's ``record`` costs per step (per-position counters), and one step-cell read (the
``tabletune_get_step_cells`` utility the sync loop calls once a second) with every cell used.

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
from tabletune.plugin.engine import step_timer_of, wrap_update_from_output
from tabletune.plugin.metrics import make_stat_logger_class
from tabletune.plugin.policy import StepPolicy
from tabletune.plugin.step_timer import StepTimer
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
        "policy_all_with_neighbour_16": StepPolicy(
            lookup,
            explore_k=K,
            exploration_interval=50,
            hysteresis=8,
            neighbour_interval=16,
            allowed_k=(1, 2, 3),
        ),
    }
    for name, table in cases.items():
        state = {"i": 0}

        def step(table: Any = table, state: dict[str, int] = state) -> object:
            state["i"] = (state["i"] + 1) & 1023
            return table[batches[state["i"]]]

        results[name] = per_call_ns(step, calls, repeats)
    return results


def scheduler_output(batch: int, k: int, prefill: int = 0) -> SimpleNamespace:
    """A ``SchedulerOutput``'s fields the timer reads: ``batch`` requests, one of them a prefill
    of ``prefill`` tokens when given, the others decoding with ``k`` drafts (async scheduling
    hands every request the same placeholder list)."""
    placeholder = [-1] * k
    ids = [f"req-{i:05d}-{i * 7919 % 100_000:05d}" for i in range(batch)]
    decoding = ids[1:] if prefill else ids
    tokens = dict.fromkeys(decoding, 1 + k)
    if prefill:
        tokens[ids[0]] = prefill
    return SimpleNamespace(
        num_scheduled_tokens=tokens,
        total_num_scheduled_tokens=sum(tokens.values()),
        scheduled_spec_decode_tokens=dict.fromkeys(decoding, placeholder) if k else {},
    )


class NoOpScheduler:
    """vLLM's Scheduler as the wrapper sees it, with nothing inside ``update_from_output``."""

    def update_from_output(self, scheduler_output: object, model_runner_output: object) -> None:
        return None

    def has_requests(self) -> bool:
        return True


class TimedScheduler(NoOpScheduler):
    pass


TimedScheduler.update_from_output = wrap_update_from_output(  # type: ignore[method-assign]
    NoOpScheduler.update_from_output
)


def step_timing_cases(calls: int, repeats: int) -> dict[str, dict[str, float]]:
    """Per ``update_from_output`` call: the bare method, then wrapped with timing on and off."""
    results = {}
    cases = {
        "B1_k3": scheduler_output(1, 3),
        "B64_k3": scheduler_output(64, 3),
        "B256_k3": scheduler_output(256, 3),
        "B256_k3_with_prefill": scheduler_output(256, 3, prefill=60),
        "B256_k0_with_prefill": scheduler_output(256, 0, prefill=60),  # scans for 1-token
    }
    for name, out in cases.items():
        bare, timed, off = NoOpScheduler(), TimedScheduler(), TimedScheduler()
        step_timer_of(off).set_enabled(False)
        for label, scheduler in (("no_plugin", bare), ("timing_on", timed), ("timing_off", off)):
            results[f"{name}_{label}"] = per_call_ns(
                lambda s=scheduler, o=out: s.update_from_output(o, None), calls // 10, repeats
            )
    return results


def step_cells_read_cases(repeats: int) -> dict[str, dict[str, float]]:
    """One ``tabletune_get_step_cells`` answer (on the engine thread, once per sync round):
    every (k, batch size) of this engine used, and a load wandering over B = 100..160 at k 2-3."""
    cases = {
        "every_k_and_batch_size": [(k, b) for k in range(K + 1) for b in range(1, MAX_SEQS + 1)],
        "k2_k3_batch_100_to_160": [(k, b) for k in (2, 3) for b in range(100, 161)],
    }
    results = {}
    for name, used in cases.items():
        timer = StepTimer(started_at=0.0)
        for k, batch in used:
            timer.counter.record(batch_size=batch, k=k, duration_s=0.01, tokens=batch * (k + 1))
        results[f"{name}_({len(used)}_used)"] = per_call_ns(timer.to_wire, 50, repeats)
    return results


@dataclass
class Spec:
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
        scheduler = SimpleNamespace(spec_decoding_stats=Spec([batch] * K))
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
        "engine_side_update_from_output": step_timing_cases(args.calls, args.repeats),
        "engine_side_step_cells_read": step_cells_read_cases(args.repeats),
        "api_side_record": record_cases(args.calls, args.repeats),
        "command": "python bench/plugin_step_cost.py",
    }
    with open(args.out, "w") as out:
        json.dump(result, out, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
