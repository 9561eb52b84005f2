"""``tabletune compare``: per-load loss of tables vs the best fixed k at each load."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tabletune.cli.inputs import add_table_options, load_inputs, table_problem
from tabletune.errors import InputError
from tabletune.schemas import load_table
from tabletune.schemas.shape import TimingShape, profile_shape_mismatch
from tabletune.solver import Evaluation, SolverError, TableProblem, evaluate_table, solve


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "compare",
        help="score tables against the best fixed k at each load",
        description=(
            "Per-load loss vs the best fixed k and worst-load loss for each table. Tables are "
            "files, inline JSON, or 'docs' (vLLM's documented EAGLE table "
            "[[1,64,3],[65,128,1],[129,512,0]]). TableTune's own table is always included."
        ),
    )
    parser.add_argument("--profile", required=True)
    parser.add_argument("--acceptance", help="acceptance JSON (default: the profile's own)")
    parser.add_argument("--table", action="append", default=[], help="repeatable")
    parser.add_argument("--max-batch", type=int, help="largest load (default: grid max)")
    add_table_options(parser)
    parser.add_argument(
        "--live-shape",
        action="append",
        default=[],
        type=_live_shape,
        metavar="K:BATCH:TOKENS",
        help="a live step cell's k, mean batch and mean scheduled tokens per step (from the "
        "plugin's tabletune_step_* counters); warns when the profile was timed on another "
        "shape (repeatable)",
    )
    parser.add_argument(
        "--live-context", type=float, help="mean context of the live requests, in tokens"
    )
    parser.add_argument("--plot", help="write a PNG of loss vs load (needs matplotlib)")
    parser.add_argument("--json-out", help="write the comparison as JSON")
    parser.set_defaults(run=run)


def _live_shape(text: str) -> tuple[int, float, float]:
    parts = text.split(":")
    try:
        k, batch, tokens = int(parts[0]), float(parts[1]), float(parts[2])
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"expected K:BATCH:TOKENS, got {text!r}") from None
    if len(parts) != 3 or k < 0 or not batch > 0 or not tokens >= 0:
        raise argparse.ArgumentTypeError(f"expected K:BATCH:TOKENS with BATCH > 0, got {text!r}")
    return k, batch, tokens


def shape_warnings(
    shape: TimingShape | None, cells: list[tuple[int, float, float]], context: float | None
) -> list[str]:
    """What ``profile_shape_mismatch`` says about each live cell given (deduplicated)."""
    out: list[str] = []
    for k, batch, tokens in cells:
        for problem in profile_shape_mismatch(
            shape,
            k=k,
            live_batch=batch,
            live_tokens_per_step=tokens,
            live_context_tokens=context,
        ):
            if problem not in out:
                out.append(problem)
    return out


def run(args: argparse.Namespace) -> int:
    inputs = load_inputs(args.profile, args.acceptance, args.max_batch)
    big_k = inputs.profile.metadata.num_speculative_tokens
    tables = [(spec, load_table(spec, max_k=big_k)) for spec in args.table]
    problem = table_problem(inputs, args)
    try:
        ours = solve(problem)
        results: dict[str, Evaluation] = {
            "tabletune": evaluate_table(
                inputs.step_times, inputs.rates, ours.ranges, max_batch=inputs.max_batch
            )
        }
        for spec, table in tables:
            results[spec] = evaluate_table(
                inputs.step_times,
                inputs.rates,
                table.ranges,
                max_batch=inputs.max_batch,
                max_k=big_k,
            )
    except SolverError as error:
        raise InputError(str(error)) from None
    loads = [b for b in inputs.profile.batch_grid if b <= inputs.max_batch]
    _print(results, loads)
    if problem.confidence > 0:
        print(
            f"(losses use the profile's medians; tabletune's table changes k only on gains "
            f"above {problem.confidence:g} sigma of their spread, so it may trail them there)"
        )
    warnings = shape_warnings(
        inputs.profile.metadata.timing_shape, args.live_shape, args.live_context
    )
    for warning in warnings:
        print(f"WARNING: {warning}")
    if args.json_out:
        _write_json(args.json_out, results, loads, args.profile, problem, warnings)
    if args.plot:
        _plot(args.plot, results)
    return 0


def _print(results: dict[str, Evaluation], loads: list[int]) -> None:
    shown = [b for b in loads if b in {1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, 256}]
    names = list(results)
    width = max(len(n) for n in names)
    print("loss vs the best fixed k at each load (0.0% = as good as the best fixed k)")
    print(f"{'table':<{width}}  " + " ".join(f"{'B=' + str(b):>7}" for b in shown) + "   worst")
    for name in names:
        ev = results[name]
        cells = " ".join(f"{ev.loss(b):>7.1%}" for b in shown)
        where, worst = ev.worst_loss(loads)
        print(f"{name:<{width}}  {cells}   {worst:.1%} at B={where}")
    best = results[names[0]].best_fixed_k
    print(f"{'best fixed k':<{width}}  " + " ".join(f"{best[b - 1]:>7}" for b in shown))


def _write_json(
    path: str,
    results: dict[str, Evaluation],
    loads: list[int],
    profile: str,
    problem: TableProblem,
    warnings: list[str],
) -> None:
    payload = {
        "profile": profile,
        "shape_warnings": warnings,
        "rates": list(problem.rates),
        "settings": {
            "stickiness": problem.stickiness,
            "confidence": problem.confidence,
            "min_width": problem.min_width,
        },
        "loads": loads,
        "tables": {
            name: {
                "loss": [ev.loss(b) for b in loads],
                "worst_load": ev.worst_loss(loads)[0],
                "worst_loss": ev.worst_loss(loads)[1],
            }
            for name, ev in results.items()
        },
    }
    Path(path).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def _plot(path: str, results: dict[str, Evaluation]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install 'tabletune[plot]'") from None
    figure, axis = plt.subplots(figsize=(8, 4.5))
    for name, ev in results.items():
        loads = range(1, ev.max_batch + 1)
        axis.plot(list(loads), [100 * ev.loss(b) for b in loads], label=name)
    axis.set_xlabel("load (concurrent requests B)")
    axis.set_ylabel("loss vs best fixed k (%)")
    axis.set_title("Goodput loss per load")
    axis.legend()
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
