"""Summarise a profile run for bench/results/: the profiler's summary, the end-to-end wall time
and whether the measured a_i are within the tolerance of the synthetic rates that were set.
Standard library only (runs on the GPU host). Exit 1 when the check fails."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("summary", type=Path)
    parser.add_argument("--rates", required=True, help="the synthetic rates that were set")
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--end-to-end-s", type=float, required=True)
    parser.add_argument("--exit-code", type=int, default=0, help="the profiler's exit code")
    args = parser.parse_args()
    expected = [float(r) for r in args.rates.split(",")]
    result: dict[str, object] = {
        "kind": "tabletune.bench.profile",
        "profiler_exit_code": args.exit_code,
        "end_to_end_s": round(args.end_to_end_s, 1),
        "acceptance_set": expected,
        "tolerance": args.tolerance,
    }
    if not args.summary.exists():
        result["ok"] = False
        result["error"] = f"no summary at {args.summary} (the run did not finish)"
        print(json.dumps(result, indent=2))
        return 1
    summary = json.loads(args.summary.read_text())
    measured = (summary.get("acceptance") or {}).get("rates") or []
    errors = [abs(m - e) for m, e in zip(measured, expected, strict=False)]
    within = len(measured) == len(expected) and all(e <= args.tolerance for e in errors)
    result.update(
        acceptance_measured=measured,
        acceptance_abs_error=[round(e, 4) for e in errors],
        acceptance_within_tolerance=within,
        ok=within and args.exit_code == 0,
        summary=summary,
    )
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
