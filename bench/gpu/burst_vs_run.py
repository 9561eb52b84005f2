"""Neighbour bursts against running: what a k's burst steps took next to what the same k took as
a fixed arm, at the same batch cell, in the same launch (eval_traffic.py runs of blocks), and
the spread of single steps' times of every fixed arm (``arm_step_spreads``). Where the bursts'
error comes from (``error_sources``, also per shape): set beside what the steps' own spread
explains, and beside a correction for the prompt tokens a burst carries (it runs amid the
table's k, whose requests finish, and whose prompts arrive, at that k's pace) fed the run's own
prompt tokens, the most such a correction could know.

In a daemon part's window a cell's k with under a third of the busiest k's steps is a burst
(the plugin's bursts are 3 timed steps every 32); the fixed arms' windows of the same load give
the k's own running step time. Also, for one daemon part and load, the daemon's view window by
window (its step-time estimator at this checkout fed the part's recorded cells: T_hat, its
relative uncertainty and live steps per k), which is what its decisions and bursts rested on.

    RAW=bench/results/gpu_raw
    .venv/bin/python bench/gpu/burst_vs_run.py $RAW/eval_traffic_*blocks_h200_*.json \\
        --view decode-heavy-B128-daemon:127 \\
        --view-raw $RAW/eval_traffic_decode_heavy_b64_b128_blocks_h200_20261201T0710Z.json
writes bench/results/burst_vs_run_h200.json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from tabletune.daemon.profiles import PoolProfile, make_pool  # noqa: E402
from tabletune.daemon.setting_groups import StepTimeSettings  # noqa: E402
from tabletune.daemon.step_time import (  # noqa: E402
    StepTimeEstimate,
    StepTimeEstimator,
    StepTimeLayout,
)
from tabletune.schemas.io import load_profile  # noqa: E402
from tabletune.step_cells import cells_from_wire  # noqa: E402

Row = dict[str, Any]
BURST_SHARE = 1 / 3  # a k with fewer steps than this share of its cell's busiest k: a burst
MIN_BURST_STEPS = 20
MIN_ARM_STEPS = 50
MAX_VIEW_BATCH = 256  # the profiles' grid ends there
TOKENS_MARGIN = 10.0  # tokens a step: B·(1+k) moves by a few as the cell's mean batch does


def _add(sums: dict[Any, list[float]], key: Any, cell: list[float]) -> None:
    steps, seconds, seconds_sq, tokens, requests = cell[3], cell[4], cell[5], cell[6], cell[7]
    total = sums.setdefault(key, [0.0, 0.0, 0.0, 0.0, 0.0])
    total[0] += steps
    total[1] += seconds
    total[2] += tokens
    total[3] += seconds_sq
    total[4] += requests


def _step_sd_ms(steps: float, seconds: float, seconds_sq: float) -> float:
    """The standard deviation of single steps' times, in ms."""
    mean = seconds / steps
    return 1000 * math.sqrt(max(seconds_sq / steps - mean * mean, 0.0))


def by_batch_cell(window: Row) -> dict[tuple[int, int], list[list[float]]]:
    """A window's cells (wire rows, one per k) grouped by their batch cell (low, high)."""
    grouped: dict[tuple[int, int], list[list[float]]] = defaultdict(list)
    for cell in window["cells"]["cells"]:
        grouped[(cell[1], cell[2])].append(cell)
    return grouped


def burst_sums(windows: Iterable[Row]) -> dict[tuple[int, int, int], list[float]]:
    """(k, low, high) -> steps, seconds, tokens, seconds squared, requests of the burst steps in
    a daemon part's windows."""
    sums: dict[Any, list[float]] = {}
    for window in windows:
        for (low, high), cells in by_batch_cell(window).items():
            busiest = max(cell[3] for cell in cells)
            for cell in cells:
                if cell[3] < busiest * BURST_SHARE:
                    _add(sums, (int(cell[0]), low, high), cell)
    return sums


def arm_sums(windows: Iterable[Row]) -> dict[tuple[int, int, int], list[float]]:
    """(k, low, high) -> the same, from the fixed arms' windows (their own k only)."""
    sums: dict[Any, list[float]] = {}
    for window in windows:
        arm = window["arm"]
        if not (arm.startswith("k") and arm[1:].isdigit()):
            continue
        for cell in window["cells"]["cells"]:
            if int(cell[0]) == int(arm[1:]):
                _add(sums, (int(cell[0]), int(cell[1]), int(cell[2])), cell)
    return sums


def daemon_pool(raw: Row) -> PoolProfile:
    """The pool the launch's daemon ran with: its profile, the default acceptance prior."""
    return make_pool(load_profile(ROOT / raw["meta"]["daemon"]["profile"]), None)


def pure_decode_ms(raw: Row) -> Callable[[int, float], float] | None:
    """The profile's step time (ms) of k at a (mean, fractional) batch size: pure decode, no
    prompt riding along; None for a launch whose daemon had no profile."""
    if not raw.get("meta", {}).get("daemon", {}).get("profile"):
        return None
    profile = daemon_pool(raw).step_times
    return lambda k, batch: float(np.interp(batch, profile.grid, profile.row(k)))


def prompt_corrected(
    burst_ms: float, pure_ms: float, burst_prompt: float, arm_prompt: float
) -> float | None:
    """What the burst's steps would take carrying the arm's prompt tokens, were a step's time
    over its pure-decode time (the profile's) in proportion to the prompt tokens riding along
    (a graph fall included); None where the burst's steps carried under one prompt token."""
    if burst_prompt < 1.0:
        return None
    return pure_ms + (arm_prompt / burst_prompt) * (burst_ms - pure_ms)


def log_ratio_sd(burst: list[float], arm: list[float], correlation: float) -> float:
    """Standard error of log(burst mean / arm mean) from their steps' spreads, neighbouring
    steps counted as ``1/correlation`` independent samples (the estimator's model)."""
    total = 0.0
    for steps, seconds, _tokens, seconds_sq, *_ in (burst, arm):
        share = _step_sd_ms(steps, seconds, seconds_sq) / (1000 * seconds / steps)
        total += share * share * correlation / steps
    return math.sqrt(total)


def compare(raw: Row) -> list[Row]:
    out = []
    parts = sorted({w["part"] for w in raw["windows"] if w["part"].endswith("-daemon")})
    pure = pure_decode_ms(raw)
    correlation = StepTimeSettings().correlation
    for part in parts:
        load = part.removesuffix("-daemon")
        bursts = burst_sums(w for w in raw["windows"] if w["part"] == part)
        arms = arm_sums(w for w in raw["windows"] if w["part"] == f"{load}-arms")
        for key, sums in sorted(bursts.items()):
            steps, seconds, tokens, _sq, requests = sums
            own = arms.get(key)
            if steps < MIN_BURST_STEPS or own is None or own[0] < MIN_ARM_STEPS:
                continue
            k = key[0]
            burst_ms, arm_ms = 1000 * seconds / steps, 1000 * own[1] / own[0]
            batch = requests / steps
            # Scheduled tokens beyond B·(1+k) are prompt tokens riding along.
            burst_prompt = tokens / steps - batch * (1 + k)
            arm_prompt = own[2] / own[0] - own[4] / own[0] * (1 + k)
            pure_ms = pure(k, batch) if pure is not None else None
            corrected = (
                prompt_corrected(burst_ms, pure_ms, burst_prompt, arm_prompt)
                if pure_ms is not None
                else None
            )
            noise = log_ratio_sd(sums, own, correlation)
            out.append({
                "load": load, "k": k, "cell": [key[1], key[2]],
                "burst_steps": int(steps), "burst_ms": round(burst_ms, 2),
                "burst_tokens_per_step": round(tokens / steps, 1),
                "arm_steps": int(own[0]), "arm_ms": round(arm_ms, 2),
                "arm_step_sd_ms": round(_step_sd_ms(own[0], own[1], own[3]), 2),
                "arm_tokens_per_step": round(own[2] / own[0], 1),
                "ratio": round(burst_ms / arm_ms, 3),
                "burst_prompt_tokens_per_step": round(burst_prompt, 1),
                "arm_prompt_tokens_per_step": round(arm_prompt, 1),
                "pure_decode_ms": None if pure_ms is None else round(pure_ms, 2),
                "ratio_prompt_corrected":
                    None if corrected is None else round(corrected / arm_ms, 3),
                "log_ratio_sd": round(noise, 4),
            })  # fmt: skip
    return out


def extra_spread(errors: list[float], sds: list[float], top: float = 0.5) -> float:
    """The spread beyond each error's own standard error that makes the errors likeliest
    (normal, sd^2 + extra^2; searched in steps of 0.001 up to ``top``)."""

    def log_likelihood(extra: float) -> float:
        variances = [sd * sd + extra * extra for sd in sds]
        return -sum(e * e / v + math.log(v) for e, v in zip(errors, variances, strict=True))

    grid = [i / 1000 for i in range(int(top * 1000) + 1)]
    return max(grid, key=log_likelihood) if errors else 0.0


def error_sources(pairs: list[Row]) -> Row:
    """How far the bursts read from their k's run (mean |log ratio|), against what the steps'
    own spread explains (the pairs past twice their standard error; the spread beyond it that
    fits the pairs best) and against a correction
    for the prompt tokens a burst carries beside its run's, fed the run's own prompt tokens
    (the best such a correction could know): if it leaves the error as it was, the bursts'
    error is not the prompts they carry."""
    if not pairs:
        return {"pairs": 0}
    logs = [abs(math.log(p["ratio"])) for p in pairs]
    corrected = [p for p in pairs if (p.get("ratio_prompt_corrected") or 0.0) > 0.0]
    beyond = [p for p in pairs if abs(math.log(p["ratio"])) > 2 * p["log_ratio_sd"]]
    return {
        "pairs": len(pairs),
        "mean_abs_log_ratio": round(statistics.mean(logs), 4),
        "median_log_ratio_sd": round(statistics.median(p["log_ratio_sd"] for p in pairs), 4),
        "share_past_two_sd": round(len(beyond) / len(pairs), 3),
        "extra_log_sd": extra_spread(
            [math.log(p["ratio"]) for p in pairs], [p["log_ratio_sd"] for p in pairs]
        ),
        "prompt_corrected_pairs": len(corrected),
        "mean_abs_log_ratio_of_those": round(
            statistics.mean(abs(math.log(p["ratio"])) for p in corrected), 4
        ) if corrected else None,
        "mean_abs_log_ratio_prompt_corrected": round(
            statistics.mean(abs(math.log(p["ratio_prompt_corrected"])) for p in corrected), 4
        ) if corrected else None,
    }  # fmt: skip


def switch_steps(raw: Row) -> list[Row]:
    """Per daemon part whose windows counted steps at a new k (the plugin counts them apart,
    not in the cells; windows record them since 2026-12-01 15:20): their number and mean time
    beside the part's running steps' (each cell's busiest k), to see whether a burst's cost
    lands on its first step or the one back."""
    out = []
    parts = sorted({w["part"] for w in raw["windows"] if w["part"].endswith("-daemon")})
    for part in parts:
        windows = [w for w in raw["windows"] if w["part"] == part]
        steps = sum(w["cells"].get("switch_steps", 0) for w in windows)
        if steps <= 0:
            continue
        seconds = sum(w["cells"].get("switch_seconds", 0.0) for w in windows)
        run = [0.0, 0.0]
        for window in windows:
            for cells in by_batch_cell(window).values():
                busiest = max(cells, key=lambda cell: cell[3])
                run[0] += busiest[3]
                run[1] += busiest[4]
        out.append({
            "load": part.removesuffix("-daemon"), "switch_steps": int(steps),
            "switch_ms": round(1000 * seconds / steps, 2),
            "running_ms": round(1000 * run[1] / run[0], 2) if run[0] else None,
        })  # fmt: skip
    return out


def by_tokens_carried(pairs: list[Row], *, margin: float) -> Row:
    """The pairs' burst/arm ratios grouped by the tokens a burst step carried beside its arm's
    (same k and cell, so the difference is prompt tokens riding along: a burst runs amid the
    table's k, whose requests finish, and new prompts arrive, at that k's pace), with the
    correlation of ratio and difference."""
    difference = [p["burst_tokens_per_step"] - p["arm_tokens_per_step"] for p in pairs]
    ratios = [p["ratio"] for p in pairs]

    def group(keep: Callable[[float], bool]) -> Row:
        chosen = [r for d, r in zip(difference, ratios, strict=True) if keep(d)]
        return {
            "pairs": len(chosen),
            "ratio_median": round(statistics.median(chosen), 4) if chosen else None,
        }

    spread = len(set(difference)) > 1 and len(set(ratios)) > 1
    return {
        "margin_tokens": margin,
        "fewer": group(lambda d: d < -margin),
        "alike": group(lambda d: -margin <= d <= margin),
        "more": group(lambda d: d > margin),
        "pearson_r": round(statistics.correlation(difference, ratios), 3) if spread else None,
        "per_shape": per_shape_slopes(pairs),
    }


def _shape(load: str) -> str:
    """A load's traffic shape: its name less the clients (``decode-heavy-B256``)."""
    return load.rsplit("-B", 1)[0]


def per_shape_slopes(pairs: list[Row]) -> Row:
    """Per traffic shape (the load's name less its clients): what a token more a step cost, by
    least squares through zero of the arm's step time less the burst's on the arm's tokens a
    step less the burst's; a cost per arriving request would show as slopes that differ by
    the shapes' prompt lengths."""
    shapes: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for p in pairs:
        shape = _shape(p["load"])
        tokens = p["arm_tokens_per_step"] - p["burst_tokens_per_step"]
        shapes[shape].append((tokens, p["arm_ms"] - p["burst_ms"]))
    out: Row = {}
    for shape, points in sorted(shapes.items()):
        tokens = [t for t, _ in points]
        ms = [m for _, m in points]
        squares = sum(t * t for t in tokens)
        spread = len(points) > 2 and len(set(tokens)) > 1 and len(set(ms)) > 1
        out[shape] = {
            "pairs": len(points),
            "ms_per_token": round(sum(t * m for t, m in points) / squares, 4) if squares else None,
            "pearson_r": round(statistics.correlation(tokens, ms), 3) if spread else None,
        }
    return out


def replayed(raw: Row, part: str) -> Iterator[tuple[Row, float, StepTimeEstimate, PoolProfile]]:
    """The daemon part's windows fed in turn into this checkout's estimator (default step-time
    settings, the part's prior): each window, the seconds so far and the estimate after it."""
    pool = daemon_pool(raw)
    settings = StepTimeSettings()
    estimator = StepTimeEstimator(StepTimeLayout.of_pool(pool))
    params = settings.blend_params()
    elapsed = 0.0
    for window in raw["windows"]:
        if window["part"] != part:
            continue
        elapsed += window["wall_s"]
        cells = cells_from_wire(window["cells"])[0]
        settings.feed(estimator, cells, elapsed)
        yield window, elapsed, estimator.estimate(params, prior_sigma=pool.relative_sigma), pool


def arm_spreads(raw: Row) -> list[Row]:
    """Per load, fixed k and batch cell: the mean and the spread of single steps' times."""
    out = []
    loads = sorted(
        {w["part"].removesuffix("-arms") for w in raw["windows"] if w["part"].endswith("-arms")}
    )
    for load in loads:
        arms = arm_sums(w for w in raw["windows"] if w["part"] == f"{load}-arms")
        for (k, low, high), (steps, seconds, _tokens, seconds_sq, _) in sorted(arms.items()):
            if steps < MIN_ARM_STEPS:
                continue
            mean_ms, sd_ms = 1000 * seconds / steps, _step_sd_ms(steps, seconds, seconds_sq)
            out.append({
                "load": load, "k": k, "cell": [low, high], "steps": int(steps),
                "mean_ms": round(mean_ms, 2), "sd_ms": round(sd_ms, 2),
                "sd_over_mean": round(sd_ms / mean_ms, 3),
            })  # fmt: skip
    return out


def daemon_view(raw: Row, part: str, batch: int) -> list[Row]:
    """The estimator's T_hat per k at ``batch`` after each of the part's windows."""
    out = []
    for window, elapsed, estimate, _pool in replayed(raw, part):
        column = next(j for j, (low, high) in enumerate(estimate.cells) if low <= batch <= high)
        out.append({
            "after_s": round(elapsed, 1),
            "table": window["view"]["table"],
            "neighbour_ks": window["view"]["neighbour_ks"],
            "per_k": {
                str(k): {
                    "t_hat_ms": round(estimate.step_times.at(batch, k), 2),
                    "relative_sigma": round(float(estimate.relative_sigma[i, batch - 1]), 3),
                    "live_steps": round(float(estimate.steps[i, column]), 1),
                }
                for i, k in enumerate(estimate.ks)
            },
        })  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", nargs="+", help="eval_traffic.py raw runs of blocks")
    parser.add_argument("--view", help="PART:B, the daemon part and load to replay the view of")
    parser.add_argument("--view-raw", help="the raw run holding --view's part")
    parser.add_argument("--out", default=str(ROOT / "bench/results/burst_vs_run_h200.json"))
    args = parser.parse_args()
    pairs, spreads, switches = [], [], []
    for path in args.raw:
        raw = json.loads(Path(path).read_text())
        pairs += [{"raw": Path(path).name, **row} for row in compare(raw)]
        spreads += [{"raw": Path(path).name, **row} for row in arm_spreads(raw)]
        switches += [{"raw": Path(path).name, **row} for row in switch_steps(raw)]
    ratios = [p["ratio"] for p in pairs]
    result: Row = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "burst_share": BURST_SHARE,
        "pairs": pairs,
        "ratio_median": statistics.median(ratios) if ratios else None,
        "ratio_range": [min(ratios), max(ratios)] if ratios else None,
        "by_tokens_carried": by_tokens_carried(pairs, margin=TOKENS_MARGIN),
        "error_sources": error_sources(pairs),
        "error_sources_per_shape": {
            shape: error_sources([p for p in pairs if _shape(p["load"]) == shape])
            for shape in sorted({_shape(p["load"]) for p in pairs})
        },
        "arm_step_spreads": spreads,
        "switch_steps": switches,
    }
    if args.view:
        if not args.view_raw:
            parser.error("--view needs --view-raw")
        part, _, batch = args.view.rpartition(":")
        if not part or not batch.isdigit() or not 1 <= int(batch) <= MAX_VIEW_BATCH:
            parser.error(f"--view {args.view!r}: PART:B with B in 1..{MAX_VIEW_BATCH}")
        raw = json.loads(Path(args.view_raw).read_text())
        windows = daemon_view(raw, part, int(batch))
        if not windows:
            parser.error(f"--view: {args.view_raw} has no window of part {part!r}")
        result["daemon_view"] = {
            "raw": Path(args.view_raw).name,
            "part": part,
            "batch": int(batch),
            "windows": windows,
        }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for p in pairs:
        print(
            f"{p['raw'][:48]:48} {p['load']:18} k={p['k']} {p['burst_ms']:6.2f} ms in "
            f"bursts ({p['burst_steps']}) vs {p['arm_ms']:6.2f} as an arm: {p['ratio']:.2f}"
        )
    carried = result["by_tokens_carried"]
    print(
        "by tokens a burst step carried beside its arm's: "
        + ", ".join(f"{g} {carried[g]}" for g in ("fewer", "alike", "more"))
        + f", r {carried['pearson_r']}"
    )
    print(f"error sources: {result['error_sources']}")
    print(f"median {result['ratio_median']}, range {result['ratio_range']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
