"""Does raising vLLM's CUDA-graph capture limit remove the k=2 / k=3 cliffs? Two launches of the
fast profiler on one host (profile_fast.sh with vLLM's default limit, capture_size.sh with
``max_cudagraph_capture_size`` 1024) -> bench/results/capture_size_h200.json.

Per cell (B, k) both launches timed: step ms under each limit, the graph each ran on, the ratio.
Next to it what the higher limit costs: graph capture time and graph memory from the engine's
log, start-up, GPU memory once serving. The recommendation follows from the numbers: raise the
limit when the cells past the default limit get faster by more than their noise.

    .venv/bin/python bench/gpu/capture_size_report.py DEFAULT_PROFILE DEFAULT_JOB \
        RAISED_PROFILE RAISED_JOB [--out OUT.json]

(PROFILE: the run's profile.json; JOB: the job's JSON, profile_fast.json / capture_size.json.)
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

RESULT = Path(__file__).resolve().parents[1] / "results" / "capture_size_h200.json"
Row = dict[str, Any]


def cells(profile: Row) -> dict[tuple[int, int], Row]:
    return {(c["batch_size"], c["k"]): c for c in profile["cells"]}


def spread(cell: Row) -> float:
    """Relative range of a cell's repeated windows."""
    samples = cell["samples_ms"]
    return (max(samples) - min(samples)) / statistics.median(samples)


def compare(default: Row, default_job: Row, raised: Row, raised_job: Row) -> Row:
    before, after = cells(default), cells(raised)
    rows = []
    for key in sorted(set(before) & set(after)):
        b, a = before[key], after[key]
        rows.append({
            "batch_size": key[0], "k": key[1],
            "tokens_per_step": key[0] * (key[1] + 1),
            "default_ms": round(b["step_ms"], 3), "default_graph": b.get("cuda_graph"),
            "raised_ms": round(a["step_ms"], 3), "raised_graph": a.get("cuda_graph"),
            "speedup": round(b["step_ms"] / a["step_ms"], 3),
            "noise": round(max(spread(b), spread(a)), 4),
        })  # fmt: skip
    limit = default_job["summary"]["engine"]["max_capture_size"]
    past = [r for r in rows if r["tokens_per_step"] > limit]
    within = [r for r in rows if r["tokens_per_step"] <= limit]
    faster = [r for r in past if r["speedup"] - 1 > r["noise"]]
    engine_b, engine_a = default_job["summary"]["engine"], raised_job["summary"]["engine"]
    cost = {
        "capture_s": [engine_b["capture_s"], engine_a["capture_s"]],
        "graph_gib": [engine_b["capture_gib"], engine_a["capture_gib"]],
        "startup_s": [default_job["summary"]["startup_s"], raised_job["summary"]["startup_s"]],
        "gpu_memory_used_mib": [engine_b["gpu_memory_used_mib"], engine_a["gpu_memory_used_mib"]],
        "note": "[default limit, raised limit]; the two launches ran one after the other on one "
        "host, the second may have reused the first's compile cache: start-up is not a "
        "like-for-like pair; vLLM sizes its KV cache to what is left, so memory used is near "
        "the same and the graphs' extra GiB come out of the KV cache",
    }
    return {
        "meta": {
            "what": "k=2/k=3 cells past vLLM's CUDA-graph capture limit, default vs raised",
            "device": default_job["meta"]["device"],
            "engine_version": default_job["meta"]["engine_version"],
            "dates": [default_job["meta"]["date"], raised_job["meta"]["date"]],
            "commits": [default_job["meta"]["commit"], raised_job["meta"]["commit"]],
            "limits": [limit, engine_a["max_capture_size"]],
        },
        "cells": rows,
        "past_the_default_limit": {
            "cells": len(past),
            "faster_beyond_noise": len(faster),
            "median_speedup": statistics.median(r["speedup"] for r in past) if past else None,
        },
        "within_the_default_limit": {
            "cells": len(within),
            "median_speedup": statistics.median(r["speedup"] for r in within) if within else None,
        },
        "cost": cost,
        "recommendation": (
            f"raise max_cudagraph_capture_size to {engine_a['max_capture_size']}: "
            f"{len(faster)} of {len(past)} cells past B*(k+1)={limit} ran faster beyond their "
            "noise, for the capture time and graph memory above"
            if past and len(faster) * 2 > len(past)
            else "keep the default: the cells past the limit did not get faster beyond noise"
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("default_profile", "default_job", "raised_profile", "raised_job"):
        parser.add_argument(name)
    parser.add_argument("--out", default=str(RESULT))
    args = parser.parse_args()
    paths = (args.default_profile, args.default_job, args.raised_profile, args.raised_job)
    load = [json.loads(Path(p).read_text()) for p in paths]
    result = compare(*load)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in
                      ("past_the_default_limit", "within_the_default_limit", "cost",
                       "recommendation")}, indent=1))  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
