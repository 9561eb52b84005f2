"""What exploring cost at one load over several launches of one code, step by step from their
engine step traces (step_trace_report.exploring_parts: the daemon part's windows after its
table last changed, every decoding step's kept tokens over its time against the table k's own
steps): each launch's loss and bootstrap interval, and the launches together, each launch's
loss weighted by the seconds it ran, its windows resampled within it (launches differ ~2x in
tokens/s, so windows are not pooled across them). One 9-minute launch holds 80-130 such
windows at decode-heavy B≈254, too few for an interval inside a 1.5 % goal; three together
may be.

    RAW=bench/results/gpu_raw
    .venv/bin/python bench/gpu/exploring_pooled.py --name decode_heavy_b256_hold \\
        $RAW/eval_traffic_decode_heavy_b256_hold_blocks_h200_20261202T1035Z.json \\
        $RAW/step_trace_h200_20261202T1035Z.csv.gz ...   (RAW TRACE pairs)
writes bench/results/exploring_pooled_NAME_h200.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from code_fingerprint import code_of
from step_trace_report import (
    BOOTSTRAP_DRAWS,
    exploring_parts,
    read_trace,
    table_k_loss,
    trace_text,
)

ROOT = Path(__file__).resolve().parents[2]
Row = dict[str, Any]


def window_loss(per_window: np.ndarray) -> float:
    """1 - (all steps' kept tokens per second) / (the table k's steps'), over the windows."""
    return table_k_loss(per_window.sum(axis=0))


def pooled(launches: Sequence[np.ndarray], draws: int = BOOTSTRAP_DRAWS) -> Row:
    """The launches' losses weighted by their seconds, and the 2.5 and 97.5 percentiles of the
    same with each launch's windows drawn with replacement within it (a fixed seed)."""
    seconds = np.array([per_window[:, 1].sum() for per_window in launches])
    weights = seconds / seconds.sum()
    point = float(np.dot([window_loss(w) for w in launches], weights))
    rng = np.random.default_rng(0)
    resampled = [
        float(np.dot([window_loss(w[rng.integers(0, len(w), len(w))]) for w in launches],
                     weights))
        for _ in range(draws)
    ]  # fmt: skip
    low, high = np.percentile(resampled, [2.5, 97.5])
    return {
        "loss": round(point, 4),
        "bootstrap_95": [round(float(low), 4), round(float(high), 4)],
        "windows": int(sum(len(w) for w in launches)),
    }


def verdict(loss: float, bound: Sequence[float], goal: float) -> str:
    """As traffic_summary.py words a load's: met when the interval is within the goal, missed
    when it is past it, else "missed by point, not judgeable" or "not judgeable"."""
    low, high = bound
    if high <= goal:
        return "met"
    if low > goal:
        return "missed"
    return "missed by point, not judgeable" if loss > goal else "not judgeable"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="+", type=Path, help="RAW.json TRACE.csv.gz, repeated")
    parser.add_argument("--name", required=True)
    parser.add_argument("--goal", type=float, default=0.015)
    args = parser.parse_args(argv)
    if len(args.pairs) % 2:
        parser.error("give RAW TRACE pairs")
    launches: list[Row] = []
    windows: list[np.ndarray] = []
    for raw_path, trace_path in zip(args.pairs[::2], args.pairs[1::2], strict=True):
        raw = json.loads(raw_path.read_text())
        found = exploring_parts(raw, read_trace(trace_text(trace_path)))
        if len(found) != 1:
            parser.error(f"{raw_path.name}: {len(found)} daemon parts priced, not one")
        (row, per_window), meta = found[0], raw["meta"]
        launches.append({
            "raw": raw_path.name, "trace": trace_path.name, "date": meta["date"],
            "commit": meta["commit"], "code": code_of(meta), **{k: row[k] for k in (
                "part", "table_k", "batch", "from_s", "until_s", "windows",
                "loss_against_the_table_k_steps", "bootstrap_95")},
        })  # fmt: skip
        windows.append(per_window)
    codes = {launch["code"] for launch in launches}
    parts = {launch["part"] for launch in launches}
    if len(codes) != 1 or len(parts) != 1:
        parser.error(f"one code and one load only: {sorted(codes)}, {sorted(parts)}")
    together = pooled(windows)
    first = json.loads(args.pairs[0].read_text())["meta"]
    result = {
        "what": __doc__.splitlines()[0],
        "device": first["device"],
        "engine_version": first["engine_version"],
        "commit": max(launches, key=lambda launch: launch["date"])["commit"],
        "code": codes.pop(),
        "part": parts.pop(),
        "launches": launches,
        "pooled": together,
        "goal": f"<= {args.goal:.1%}",
        "verdict": verdict(together["loss"], together["bootstrap_95"], args.goal),
    }
    out = ROOT / f"bench/results/exploring_pooled_{args.name}_h200.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['pooled']} {result['verdict']}; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
