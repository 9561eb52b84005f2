"""``tabletune daemon [--once] [--dry-run]``: configured only by TABLETUNE_* variables."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import structlog

from tabletune.daemon import logs
from tabletune.daemon.service import build_daemon, report_json, run_forever, run_once
from tabletune.daemon.settings import deprecations, load_settings, masked


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "daemon",
        help="keep each replica's table right (configured by TABLETUNE_* variables)",
        description=(
            "Reads vLLM's counters (Prometheus or direct /metrics scrapes), estimates acceptance, "
            "and pushes better tables through the TableTune plugin. Every setting is a "
            "TABLETUNE_* environment variable (see docs/daemon.md)."
        ),
    )
    parser.add_argument("--once", action="store_true", help="run one evaluation and exit")
    parser.add_argument("--dry-run", action="store_true", help="compute and report; push nothing")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = load_settings()  # InputError naming the variable -> main prints it, exit 2
    logs.configure(level=settings.log.level, fmt=settings.log.format)
    log = structlog.get_logger("tabletune.daemon")
    log.info(
        "effective configuration", config=masked(settings), once=args.once, dry_run=args.dry_run
    )
    for warning in deprecations(os.environ):
        log.warning(warning)
    daemon = build_daemon(settings, dry_run=args.dry_run)
    if args.once:
        try:
            outcome = run_once(daemon)
        finally:
            daemon.close()
        print(report_json(outcome))
        if outcome.problem is not None:
            print(f"tabletune daemon --once: {outcome.problem}", file=sys.stderr)
            return 1
        return 0
    return run_forever(daemon)
