"""``tabletune solve``: the goodput-maximising table for a profile and an acceptance."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tabletune.cli.inputs import load_inputs, parse_k_list
from tabletune.errors import InputError
from tabletune.solver import DEFAULT_STICKINESS, SolverError, build_table


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
    parser.add_argument(
        "--stickiness",
        type=float,
        default=DEFAULT_STICKINESS,
        help="keep the previous k unless another is better by more than this (default 0.005)",
    )
    parser.add_argument("--output", help="also write the table (vLLM JSON form) to this file")
    parser.add_argument("--json", action="store_true", help="print only the table JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    inputs = load_inputs(args.profile, args.acceptance, args.max_batch)
    allowed = parse_k_list(args.allowed_k) if args.allowed_k else None
    try:
        solution = build_table(
            inputs.step_times,
            inputs.rates,
            allowed_k=allowed,
            max_batch=inputs.max_batch,
            stickiness=args.stickiness,
        )
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
    print(f"{'batch sizes':>13}  {'k':>2}  {'goodput tok/s (start..end)':>28}")
    for start, end, k in solution.ranges:
        first = solution.goodput[start - 1] * 1000
        last = solution.goodput[end - 1] * 1000
        print(f"{start:>6}..{end:<5}  {k:>2}  {first:>12,.0f} .. {last:<12,.0f}")
    return 0
