"""Turn the JSON of `bench/gpu/profile_fast.sh` into bench/results/profile_fast_h200.json + PNG.

    .venv/bin/python bench/gpu/profile_fast_report.py RAW.json [--out PATH] [--png PATH]

Summary and four goals, each {measured, goal, pass}:
- grid_with_engine_start: engine start plus the first in-flight grid's timing (B=1..256 dense
  to 16 then every 8, k=0..3, 3 windows per cell): <= 180 s. Judged with the start the grid ran
  on: warm (WARM_START=1: a first launch filled the compile cache; or the launch found the
  host's cache filled by an earlier one, meta.compile_cache_found) or cold; with WARM_START the
  cold start and the grid with it are reported too.
- methods_agree: in-flight vs the request method on the cross-check cells, same launch, the
  median over cells of in-flight / request - 1: within +-3 %.
- tables_repeat: the tables of two in-flight grids in a row (same acceptance) choose the same k
  at >= 95 % of batch sizes 1..max.
- job_within_9_minutes: the whole job, launch to the end of the second grid: <= 540 s.
Standard library only, but for the PNG (matplotlib).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULT = Path(__file__).resolve().parents[1] / "results" / "profile_fast_h200.json"
GRID_GOAL_S = 180.0
AGREEMENT_GOAL = 0.03
TABLES_GOAL = 0.95
JOB_GOAL_S = 540.0
NEIGHBOURHOOD = 16  # full-graph cells within this many batch sizes are an off-graph cell's peers

Row = dict[str, Any]


def per_batch_k(table: Sequence[Sequence[int]]) -> dict[int, int]:
    """k at every batch size a table covers."""
    return {b: k for start, end, k in table for b in range(start, end + 1)}


def table_agreement(first: Sequence[Sequence[int]], second: Sequence[Sequence[int]]) -> Row:
    """Share of batch sizes (covered by either table) where both choose the same k."""
    a, b = per_batch_k(first), per_batch_k(second)
    batches = sorted(set(a) | set(b))
    same = [x for x in batches if a.get(x) == b.get(x)]
    return {
        "batch_sizes": len(batches),
        "same_k": len(same),
        "share": len(same) / len(batches) if batches else None,
        "differ_at": [x for x in batches if a.get(x) != b.get(x)],
    }


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def cell_ratios(first: Row, second: Row) -> Row | None:
    """run2 / run1 cell by cell (``step_ms``: k -> B -> ms, as the profiler's summary)."""
    ratios = [
        second[k][b] / ms
        for k, row in first.items()
        for b, ms in row.items()
        if k in second and b in second[k]
    ]
    if not ratios:
        return None
    return {
        "cells": len(ratios),
        "p10": quantile(ratios, 0.1),
        "p50": quantile(ratios, 0.5),
        "p90": quantile(ratios, 0.9),
        "within_10pct": sum(1 for r in ratios if abs(r - 1) <= 0.1) / len(ratios),
    }


def off_graph_cells(summary: Row) -> list[Row]:
    """Cells the dispatch model sends to piecewise or eager, with their step time against the
    median of the full-graph cells near them (same k)."""
    step = summary["step_ms"]
    not_full = summary.get("cuda_graphs", {}).get("not_full", {})
    out = []
    for key, mode in sorted(not_full.items(), key=lambda kv: tuple(map(int, kv[0].split(",")))):
        b, k = (int(v) for v in key.split(","))
        row = step.get(str(k), {})
        peers = [
            ms
            for bb, ms in row.items()
            if abs(int(bb) - b) <= NEIGHBOURHOOD and f"{bb},{k}" not in not_full
        ]
        ms = row.get(str(b))
        out.append(
            {
                "batch_size": b,
                "k": k,
                "graph": mode,
                "step_ms": ms,
                "full_graph_peers_ms": statistics.median(peers) if peers else None,
                "ratio": ms / statistics.median(peers) if peers and ms else None,
            }
        )
    return out


def run_summary(summary: Row) -> Row:
    return {
        "wall_time_s": summary["wall_time_s"],
        "in_flight_events": summary.get("in_flight_events"),
        "cells": summary["cells"],
        "windows_taken_again": summary.get("windows_taken_again"),
        "remeasured": len(summary.get("remeasured", [])),
        "noisy": len(summary.get("noisy", [])),
        "context_tokens": summary.get("context_tokens"),
        "timing_shape": summary.get("timing_shape"),
        "table": summary.get("table"),
    }


def summarize(raw: Row) -> Row:
    meta = raw["meta"]
    runs = raw.get("runs", {})
    first, second = runs.get("run1"), runs.get("run2")
    startup = meta.get("startup_s")
    cache_found = meta.get("compile_cache_found")
    if meta.get("warm_start"):
        start, cold = "warm (a first launch filled the compile cache)", meta.get("cold_start_s")
    elif cache_found:
        start, cold = "warm (the host's compile cache, filled by an earlier launch)", None
    else:
        start, cold = "cold (no compile cache on the host)", startup
    out: Row = {
        "startup_s": startup,
        "warm_start": bool(meta.get("warm_start")),
        "compile_cache_found": cache_found,
        "start": start,
        "cold_start_s": cold,
        "engine": meta.get("engine"),
        "job_wall_s": meta.get("wall_s"),
        "durations_s": raw.get("durations_s", {}),
        "errors": raw.get("errors", []),
        "skipped": raw.get("skipped", []),
    }
    if first is not None:
        timing = first["wall_time_s"].get("timing")
        out["run1"] = run_summary(first)
        out["grid_wall_with_start_s"] = (
            None if startup is None or timing is None else round(startup + timing, 1)
        )
        out["grid_wall_with_cold_start_s"] = (
            None if cold is None or timing is None else round(cold + timing, 1)
        )
        out["cross_check"] = first.get("cross_check")
        out["off_graph"] = off_graph_cells(first)
    if second is not None:
        out["run2"] = run_summary(second)
        if first is not None:
            out["repeat_cells"] = cell_ratios(first["step_ms"], second["step_ms"])
    tables = raw.get("tables", {})
    if "run1" in tables and "run2" in tables:
        out["tables"] = {**tables, "agreement": table_agreement(tables["run1"], tables["run2"])}
    return out


def _goal(measured: Any, goal: str, passed: bool | None) -> Row:
    return {"measured": measured, "goal": goal, "pass": passed}


def goals(summary: Row) -> Row:
    grid = summary.get("grid_wall_with_start_s")
    check = summary.get("cross_check")
    tables = (summary.get("tables") or {}).get("agreement")
    job = summary.get("job_wall_s")
    startup = summary.get("startup_s")
    return {
        "grid_with_engine_start": {
            **_goal(grid, f"<= {GRID_GOAL_S:.0f} s", None if grid is None else grid <= GRID_GOAL_S),
            "engine_start_s": startup,
            "start": summary.get("start"),
            "cold_start_s": summary.get("cold_start_s"),
            "with_cold_start_s": summary.get("grid_wall_with_cold_start_s"),
        },
        "methods_agree": _goal(
            None if check is None else check["median_difference"],
            f"|median(in-flight / request - 1)| <= {AGREEMENT_GOAL:.0%}",
            None if check is None else abs(check["median_difference"]) <= AGREEMENT_GOAL,
        ),
        "tables_repeat": _goal(
            None if tables is None else tables["share"],
            f"same k at >= {TABLES_GOAL:.0%} of batch sizes",
            None if tables is None or tables["share"] is None else tables["share"] >= TABLES_GOAL,
        ),
        "job_within_9_minutes": _goal(
            job, f"<= {JOB_GOAL_S:.0f} s", None if job is None else job <= JOB_GOAL_S
        ),
    }


def plot(raw: Row, path: Path) -> None:
    """T(B, k) of both runs (and the request method's cross-check cells); each run's table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = raw.get("runs", {})
    figure, (steps, chosen) = plt.subplots(2, 1, figsize=(10, 8), height_ratios=(3, 1), sharex=True)
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    for name, style in (("run1", "-"), ("run2", "--")):
        for k, row in (runs.get(name) or {}).get("step_ms", {}).items():
            batches = sorted(row, key=int)
            steps.plot(
                [int(b) for b in batches],
                [row[b] for b in batches],
                style,
                color=colours[int(k) % len(colours)],
                label=f"k={k} {name}",
                linewidth=1,
            )
    check = (runs.get("run1") or {}).get("cross_check") or {}
    for cell in check.get("cells", []):
        steps.plot(
            cell["batch_size"], cell["request_ms"], "x", color=colours[cell["k"] % len(colours)]
        )
    steps.set_yscale("log")
    steps.set_ylabel("step ms (x: request method)")
    steps.set_title(f"in-flight profile, two grids in one launch: {raw['meta'].get('device', '')}")
    steps.legend(ncol=4, fontsize=7)
    steps.grid(alpha=0.3)
    for (name, table), style in zip(raw.get("tables", {}).items(), ("-", "--"), strict=False):
        ks = per_batch_k(table)
        batches = sorted(ks)
        chosen.step(batches, [ks[b] for b in batches], style, where="mid", label=name)
    chosen.set_xlabel("batch size B")
    chosen.set_ylabel("table's k")
    chosen.legend(fontsize=7)
    chosen.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def report(raw: Row, source: str) -> Row:
    summary = summarize(raw)
    return {"meta": raw["meta"], "source": source, "goals": goals(summary), "summary": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path)
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--png", type=Path, help="the plot (default: beside --out)")
    parser.add_argument(
        "--compile-cache-found",
        action="store_true",
        help="the launch found the host's compile cache filled (for JSON written before "
        "profile_fast.sh recorded meta.compile_cache_found; say how you know)",
    )
    args = parser.parse_args(argv)
    try:
        raw = json.loads(args.raw.read_text())
        if not isinstance(raw, dict) or "meta" not in raw or "runs" not in raw:
            raise ValueError("no meta and runs: not written by bench/gpu/profile_fast.py")
    except (OSError, ValueError) as error:
        raise SystemExit(f"{args.raw}: {error}") from None
    if args.compile_cache_found:
        raw["meta"].setdefault("compile_cache_found", True)
    result = report(raw, args.raw.name)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    try:
        plot(raw, args.png or args.out.with_suffix(".png"))
    except ImportError as error:  # the numbers are what counts
        print(f"no plot: {error}")
    print(json.dumps(result["goals"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
