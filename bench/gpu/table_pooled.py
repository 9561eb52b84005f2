"""The daemon's table at one load over several launches of one code, by the k its steps ran,
against every launch's fixed-k blocks together.

One 9-minute launch at decode-heavy B≈254 holds 9-12 blocks; where k=0, k=1 and k=3 run
within a few per cent of each other, the interval of the median block ratio spans 10-16 %
and no launch can judge a 1.5 % goal (eval_traffic_report.py's ``daemon_by_k_mix``: "not
judgeable"). A block's ratios are taken within its own seconds, so the launches' ~2x
difference in tokens/s cancels in them and the blocks of several launches pool as they are;
what the daemon arm's steps ran (its share of decoding time per k) pools weighted by its
windows (each alike long). The judgement is the
same as one launch's: the loss of the k the daemon ran, priced by the fixed arms' median
ratios over all the blocks, bounded by the interval of those medians (``daemon_by_k_mix``),
with the best fixed k taken over all the blocks (each block's arms over the block's mean of
the fixed arms, averaged) and the sign test of its lead beside it. Launches whose daemon part
ended inside a trial are refused: their arm ran the trial's table, not the daemon's.

    R=bench/results/eval_traffic_decode_heavy_b256
    .venv/bin/python bench/gpu/table_pooled.py --name decode_heavy_b256_hold \\
        --part decode-heavy-B256 ${R}_hold{,_again,_nightjar}_blocks_h200.json
writes bench/results/table_pooled_NAME_h200.json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from code_fingerprint import code_of
from eval_traffic_paired import paired
from eval_traffic_report import FIXED, best_identified, daemon_by_k_mix
from exploring_pooled import verdict

ROOT = Path(__file__).resolve().parents[2]
Row = dict[str, Any]
Block = dict[str, float]


class NotPoolable(ValueError):
    """A launch that cannot join the pool (no blocks, no daemon arm, a trial at its stop)."""


def launch_part(report: Row, part: str) -> tuple[list[Block], dict[int, float], int]:
    """One launch's report at ``part``: its blocks (each arm's tokens/s), its daemon arm's
    decoding time per k, and how many windows that arm had (every window alike long)."""
    load = (report.get("loads") or {}).get(part)
    if load is None:
        raise NotPoolable(f"{part}: not in the report")
    arms = load.get("arms") or {}
    if "daemon" not in arms or "blocks" not in arms["daemon"]:
        raise NotPoolable(f"{part}: no daemon arm run in blocks")
    if load.get("daemon_trial_at_stop") is not None:
        raise NotPoolable(f"{part}: the daemon part ended inside a trial")
    per_arm = {arm: row["blocks"]["tokens_per_s"] for arm, row in arms.items() if "blocks" in row}
    count = len(per_arm["daemon"])
    blocks = [{arm: values[i] for arm, values in per_arm.items()} for i in range(count)]
    mix = {int(k): share for k, share in load["k_time_mix"]["daemon"].items()}
    return blocks, mix, len(arms["daemon"]["tokens_per_s"])


def pooled_mix(mixes: Sequence[tuple[dict[int, float], int]]) -> dict[int, float]:
    """Time shares per k over several launches, each weighted by its windows."""
    total = sum(windows for _, windows in mixes)
    out: dict[int, float] = {}
    for mix, windows in mixes:
        for k, share in mix.items():
            out[k] = out.get(k, 0.0) + share * windows / total
    return {k: round(v, 4) for k, v in sorted(out.items())}


def best_over_blocks(blocks: Sequence[Block], fixed: Sequence[str]) -> str:
    """The fixed arm ahead on average, each block's arms taken over the block's mean of the
    fixed arms (so a fast launch weighs no more than a slow one)."""

    def share(arm: str) -> float:
        return statistics.fmean(b[arm] / statistics.fmean(b[f] for f in fixed) for b in blocks)

    return max(fixed, key=share)


def blocks_for_the_goal(units: Sequence[Block], own: str, fixed: Sequence[str],
                        goal: float) -> int | None:  # fmt: skip
    """About how many blocks would bound the own k's loss within ``goal`` against every other
    fixed k, were the ratios to spread as they do: the interval of a median narrows as one
    over the root of the blocks, so n (h / (m - 1 + goal))^2 for the widest (h: the interval's
    half width, m: the median ratio of the own k's arm over the other's). None when some
    point is already past the goal (no number of blocks bounds it within)."""
    needed = 0.0
    for other in fixed:
        if other == own:
            continue
        pair = paired(list(units), own, other)
        interval = pair["median_ratio_interval"]
        room = pair["median_ratio"] - 1.0 + goal
        if room <= 0:
            return None
        needed = max(needed, len(units) * ((interval["high"] - interval["low"]) / 2 / room) ** 2)
    return math.ceil(needed)


def judged(blocks: Sequence[Block], mix: dict[int, float], goal: float) -> Row:
    """The daemon's loss by its k mix over the pooled blocks, as one launch's report words it."""
    fixed = [arm for arm in FIXED if all(arm in b for b in blocks)]
    if len(fixed) < 2:
        raise NotPoolable(f"fixed arms in every block: {fixed}, not two")
    units = list(blocks)
    best = best_over_blocks(units, fixed)
    arms = {arm: {"blocks": paired(units, arm, best)} for arm in fixed}
    by_mix = daemon_by_k_mix(mix, best, units, "blocks", arms)
    if by_mix["loss_upper_bound"] is None:
        raise NotPoolable(f"the daemon's own k ({by_mix['own_k']}) was not run as a fixed arm")
    own = f"k{by_mix['own_k']}"
    return {
        "best_fixed_k": best,
        "best_fixed_k_sign_test": best_identified(units, fixed, best, "block"),
        "fixed_arms_against_the_best": {
            arm: {k: v for k, v in arms[arm]["blocks"].items() if k != "ratios"}
            for arm in fixed
            if arm != best
        },
        "daemon_arm_against_the_best": {
            k: v for k, v in paired(units, "daemon", best).items() if k != "ratios"
        },
        "daemon_k_time_mix": mix,
        "daemon_by_k_mix": by_mix,
        "blocks_for_a_bound_within_the_goal": blocks_for_the_goal(units, own, fixed, goal),
    }


def pool(reports: Sequence[tuple[str, Row]], part: str, goal: float) -> Row:
    """Launches (name, report) of one code (``code_of``) at ``part`` judged together."""
    launches: list[Row] = []
    blocks: list[Block] = []
    mixes: list[tuple[dict[int, float], int]] = []
    for name, report in reports:
        try:
            mine, mix, windows = launch_part(report, part)
        except NotPoolable as exc:
            raise NotPoolable(f"{name}: {exc}") from exc
        meta = report["meta"]
        launches.append({"report": name, "date": meta["date"], "commit": meta["commit"],
                         "code": code_of(meta), "blocks": len(mine)})  # fmt: skip
        blocks += mine
        mixes.append((mix, windows))
    codes = sorted({launch["code"] for launch in launches})
    if len(codes) != 1:
        raise NotPoolable(f"one code only (commit, or code_fingerprint.py's hash): {codes}")
    result = judged(blocks, pooled_mix(mixes), goal)
    by_mix = result["daemon_by_k_mix"]
    bound = [by_mix["loss_lower_bound"], by_mix["loss_upper_bound"]]
    return {
        "commit": max(launches, key=lambda launch: launch["date"])["commit"],
        "code": codes[0],
        "part": part,
        "launches": launches,
        "blocks": len(blocks),
        **result,
        "goal": f"<= {goal:.1%}",
        "verdict": verdict(by_mix["loss_from_k_mix"], bound, goal),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path,
                        help="eval_traffic_report.py's reports, one a launch")  # fmt: skip
    parser.add_argument("--name", required=True)
    parser.add_argument("--part", required=True, help="the load, e.g. decode-heavy-B256")
    parser.add_argument("--goal", type=float, default=0.015)
    args = parser.parse_args(argv)
    try:
        reports = [(path.name, json.loads(path.read_text())) for path in args.reports]
    except (OSError, ValueError) as exc:
        parser.error(f"cannot read a report: {exc}")
    try:
        result = pool(reports, args.part, args.goal)
    except NotPoolable as exc:
        parser.error(str(exc))
    except (KeyError, TypeError, AttributeError, IndexError) as exc:
        parser.error(f"not reports eval_traffic_report.py writes ({exc!r})")
    first = reports[0][1]["meta"]
    out_row = {
        "what": " ".join(__doc__.splitlines()[:2]),
        "command": "bash bench/gpu/traffic_reports.sh",
        "device": first["device"],
        "engine_version": first["engine_version"],
        **result,
    }
    out = ROOT / f"bench/results/table_pooled_{args.name}_h200.json"
    out.write_text(json.dumps(out_row, indent=1) + "\n")
    by_mix = result["daemon_by_k_mix"]
    print(f"{by_mix['loss_from_k_mix']} {by_mix['loss_lower_bound']}..{by_mix['loss_upper_bound']}"
          f" {result['verdict']}; wrote {out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
