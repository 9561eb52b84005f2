"""``tabletune solve``: the goodput-maximising table for a profile and an acceptance."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tabletune.cli.inputs import add_table_options, load_inputs, parse_k_list, table_problem
from tabletune.errors import InputError
from tabletune.solver import RangeSummary, SolverError, solve


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "solve",
        help="compute the batch-size -> k table from a profile",
        description="Print the table in vLLM's JSON form and a readable view.",
    )
    parser.add_argument("--profile", required=True, help="profile JSON (tabletune.profile)")
    parser.add_argument("--acceptance", help="acceptance JSON (default: the profile's own)")
    parser.add_argument("--allowed-k", help="comma-separated k the engine may use, e.g. 0,1,3")
    parser.add_argument("--max-batch", type=int, help="largest batch size (default: grid max)")
    add_table_options(parser)
    parser.add_argument("--output", help="also write the table (vLLM JSON form) to this file")
    parser.add_argument("--json", action="store_true", help="print only the table JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    inputs = load_inputs(args.profile, args.acceptance, args.max_batch)
    allowed = parse_k_list(args.allowed_k) if args.allowed_k is not None else None
    problem = table_problem(inputs, args, allowed)
    try:
        solution = solve(problem)
    except SolverError as error:
        raise InputError(str(error)) from None
    table = [list(r) for r in solution.ranges]
    text = json.dumps(table, separators=(",", ":"))
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    if args.json:
        print(text)
        return 0
    meta = inputs.profile.metadata
    if meta.sample:
        print("NOTE: this profile is a SAMPLE, not a measurement; profile your own setup.")
    setup = f"{meta.gpu}; {meta.model} + {meta.drafter}; K={meta.num_speculative_tokens}"
    rates = ", ".join(f"a{i}={a:.3f}" for i, a in enumerate(inputs.rates, 1))
    print(f"profile:    {args.profile} ({setup})")
    print(f"acceptance: {rates} ({inputs.rates_source})")
    print()
    print(f'"num_speculative_tokens_per_batch_size": {text}')
    print()
    print(
        f"confidence z={problem.confidence:g} (k changes only on a gain above z sigma of the "
        f"profile's spread), stickiness {problem.stickiness:.1%}, min width {problem.min_width}"
    )
    goodput = "goodput tok/s (mean ± σ)"
    print(f"{'batch sizes':>13}  {'k':>2}  {goodput:>26}  {'vs next best':>13}  why")
    for summary in solution.summaries:
        print(_view_row(summary))
    return 0


def _view_row(summary: RangeSummary) -> str:
    """One range: its predicted goodput with sigma, its margin over the next best k, and why."""
    goodput = f"{summary.goodput * 1000:,.0f} ± {summary.goodput_sigma * 1000:,.0f}"
    versus = ""
    if summary.alternative_k is not None and summary.alternative_margin is not None:
        versus = f"k={summary.alternative_k} {summary.alternative_margin:+.1%}"
    span = f"{summary.start:>6}..{summary.end:<5}"
    return f"{span}  {summary.k:>2}  {goodput:>26}  {versus:>13}  {summary.why}"
