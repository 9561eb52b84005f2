"""bench/gpu/eval_traffic.py's JSON -> bench/results/eval_traffic_<shape>_<gpu>.json (+ PNG).

Per load: tokens/s of every arm (mean, the spread of its repeated windows), the best fixed k
(k=0..3, by mean), each arm's loss against it, and whether that loss is a result: only a loss
larger than the spread of the repeated same-arm windows (the largest relative range of the two
arms compared) counts. Arms whose steps all ran at one k (the plugin's cells) are the same
configuration: the range of their means is the noise between windows too.

Paired, next to it: per round (every arm once, its windows close in time), each arm's window over
the best fixed k's window of the same round; per arm the median of those ratios (-> its paired
loss), their range (``spread_of_ratios``: ``loss_is_a_result_paired`` when the loss is larger)
and a distribution-free interval of the median (narrows as rounds are added; the range does
not). A slow drift of the machine moves both windows of a round and cancels in the ratio. Arms
running one and the same k are compared paired as well (the null). Rounds planned vs run.
In a run of interleaved blocks (meta ``rounds_per_block`` > 1) the same per block: an arm's
tokens/s in a block is its windows' tokens over their seconds (eval_traffic_paired.py); the
daemon's goal is then judged on blocks and says so (``unit``).

By the k the daemon's steps ran (``by_k_mix``): a step of one k costs the engine the same
whichever table chose it, so the daemon's loss is its steps at other k than the best fixed k's
times those k's measured losses, and is bounded, whichever fixed k is best, by the interval of
the median of its own k's fixed arm over every other fixed k (per block, else per round); a
one-sided sign test per pair says whether the best fixed k led each other beyond chance.

With the GPUs' once-a-second log (--gpu-clocks, or the job's gpu_clocks.csv beside RAW), every
window in ``windows`` gets the mean SM clock, utilization and power and the throttle reasons seen
inside it (gpu_clocks.py; windows of runs that did not record their times are aligned by the
driver's schedule and marked approximate). With the host's once-a-second CPU log (--host-load,
or the job's host_load.csv beside RAW; host_load.py), the host's busy and steal shares and the
engine core's CPU, run-queue wait and context switches in each window. Every window also
gets what the engine did (its raw row: steps, mean decoding step, prompt tokens/s, running
batch), and each load a ``stalls`` summary: the windows whose GPU was busy under 80 % (count,
arms), tokens/s correlated with the GPU's busy share, the mean step and the host figures (as
measured and within arms), and those figures in the stalled windows against the others; a
run without a log says which it lacks. With vLLM's garbage-collection lines (--gc-log, or the
job's gc_log.txt beside RAW; gc_log.py), each window's collections and the share of it they
took, correlated with tokens/s too. The daemon's convergence windows and the table it ended
with. Goals (issue 16): the daemon's worst-load loss <= 3 % (<= 1.5 % decode-heavy); the
Nightjar-style bandit's (the ``nightjar`` arm, in the engine) >= 3x the daemon's; the
Nightjar-style comparison and the shape change are reported as not run when they were not.

    .venv/bin/python bench/gpu/eval_traffic_report.py RAW.json [--out OUT.json] [--name NAME]
        [--gpu-clocks CSV] [--gpu-index 1] [--host-load CSV] [--gc-log TXT]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import re
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from common import goal  # noqa: E402
from eval_traffic_paired import by_round, paired, sign_test, whole_blocks  # noqa: E402
from gc_log import annotate as annotate_gc  # noqa: E402
from gc_log import read_for_run  # noqa: E402
from gpu_clocks import annotate, job_gpus, mean_of, read_clocks  # noqa: E402
from host_load import annotate as annotate_host  # noqa: E402
from host_load import read_host_load  # noqa: E402
from live_daemon_report import (  # noqa: E402  (this script's folder is first on sys.path)
    overlap_s,
    replay,
    rollback_holds,
    trial_at_stop,
)
from live_step_time_report import GENERATION, pooled, tau, throughput  # noqa: E402
from step_trace_report import exploring_cost, read_trace, trace_text  # noqa: E402

from tabletune.schemas import DOCUMENTED_EAGLE_TABLE  # noqa: E402
from tabletune.step_cells import CellTotals  # noqa: E402

Row = dict[str, Any]
FIXED = ("k0", "k1", "k2", "k3")
DAEMON = "daemon"  # the arm running the daemon's table, exploring off
SINGLE_K = 0.99  # an arm whose steps ran at one k this often is that fixed-k configuration
NIGHTJAR = "nightjar"  # the arm of the Nightjar-style bandit run in the engine
NIGHTJAR_FACTOR = 3.0  # issue 16: its worst-load loss at least this many times the daemon's
MAX_NUM_SEQS = 256  # every launch's (live_step_time.sh): where the documented table is cut
SETTLED_WINDOWS = 5  # the daemon's own windows after its last change at the load, to price them
ALPHA = 0.05  # a fixed k is beaten by the best when the sign test's p is at most this
STALL_GPU_PCT = 80  # a window whose GPU was busy less than this waited on the host
MIN_PAIRS = 3  # a correlation needs at least this many windows
HOST_FIGURES = (
    "engine_core_cpu",
    "engine_core_runqueue_wait",
    "engine_core_voluntary_per_s",
    "engine_core_involuntary_per_s",
    "api_server_cpu",
)  # host_load.window_host's, by the names a window line gives
FROM_HOST_LOG = (*HOST_FIGURES, "host_busy_share", "host_steal_share")
GC_SHARE = "gc_share"  # the engine core's GC time over the window: correlated where logged
FRACTIONS = {GC_SHARE, *(n for n in FROM_HOST_LOG if not n.endswith("_per_s"))}  # 3 decimals
CORRELATED = (
    "gpu_utilization_pct",
    "mean_step_ms",
    "engine_core_cpu",
    "engine_core_runqueue_wait",
    "host_steal_share",
)  # with tokens/s, per load


def arm_summary(windows: list[Row]) -> Row:
    """One arm's windows: tokens/s, their mean and relative range, the mean running batch."""
    spread = throughput(windows)
    running = [w["mean_running"] for w in windows if w["mean_running"] is not None]
    return {
        "tokens_per_s": [round(v, 1) for v in spread["tokens_per_s"]],
        "mean": round(spread["mean"], 1),
        "relative_range": None if spread["range_rel"] is None else round(spread["range_rel"], 4),
        "mean_running": round(statistics.fmean(running), 1) if running else None,
    }


def k_mix(cells: dict[Any, CellTotals], field: str = "steps") -> dict[int, float]:
    """Share of an arm's decoding steps at each k (its pooled step cells): under traffic
    with prefill the decode batch moves, so a table may run several k at one load. With
    ``field="seconds"``, the share of its decoding time: what prices a mix exactly, since an
    arm's tokens/s is its k's tokens/s weighted by the time spent at each."""
    spent: dict[int, float] = {}
    for (k, _, _), totals in cells.items():
        spent[k] = spent.get(k, 0.0) + getattr(totals, field)
    total = sum(spent.values())
    return {k: round(n / total, 4) for k, n in sorted(spent.items())} if total else {}


def model_check(windows: list[Row], arms: Iterable[str], rates: Sequence[float]) -> Row:
    """Per arm: tokens/s as vLLM counted them against what the daemon's model gives for the
    same steps (Σ requests·τ(k) over Σ step seconds, τ from the synthetic rates): the model
    holds where they agree. The ratio is the product of two: the tokens counted over those
    modelled (drafts kept past a request's last token are not counted), and the steps'
    seconds over the wall's (host time between steps, k-switch steps the cells leave out)."""
    out: Row = {}
    for arm in arms:
        rows = [w for w in windows if w["arm"] == arm and GENERATION in w.get("vllm", {})]
        cells = pooled(rows).items()
        seconds = sum(t.seconds for _, t in cells)
        if not rows or seconds <= 0:
            continue
        wall = sum(w["wall_s"] for w in rows)
        counted = sum(w["vllm"][GENERATION] for w in rows)
        modelled = sum(t.requests * tau(rates, k) for (k, _, _), t in cells)
        out[arm] = {"counted_tokens_per_s": round(counted / wall, 1),
                    "modelled_tokens_per_s": round(modelled / seconds, 1),
                    "counted_over_modelled": round(counted / wall / (modelled / seconds), 4),
                    "tokens_counted_over_modelled": round(counted / modelled, 4),
                    "step_seconds_over_wall": round(seconds / wall, 4)}  # fmt: skip
    return out


def relative_range(values: list[float]) -> float:
    return round((max(values) - min(values)) / statistics.fmean(values), 4)


def paired_loss(units: list[dict[str, float]], name: str, best: str) -> tuple[Row, bool]:
    """``name`` paired with the best fixed k over ``units`` (rounds or blocks): 1 - the median
    ratio (its loss) beside the paired figures, and whether that loss is larger than the range
    of the ratios."""
    pair = paired(units, name, best)
    loss = None if pair["median_ratio"] is None else round(1.0 - pair["median_ratio"], 4)
    result = name != best and loss is not None and abs(loss) > pair["spread_of_ratios"]
    return {"loss_vs_best_fixed_k": loss, **pair}, result


def best_identified(units: list[dict[str, float]], fixed: list[str], best: str, unit: str) -> Row:
    """Whether the best fixed k (by mean) led every other fixed k run, unit by unit, beyond
    chance (one-sided sign test at ALPHA): the order the k-mix judgement leans on."""
    against = {arm: sign_test(units, best, arm) for arm in fixed if arm != best}
    identified = bool(against) and all(t["p_one_sided"] <= ALPHA for t in against.values())
    return {"unit": unit, "alpha": ALPHA, "fixed_arms_run": fixed, "against": against,
            "identified": identified}  # fmt: skip


def loss_of(ratio: float) -> float:
    """A fixed k's loss from its ratio to the best: 1 - ratio, within 0..1."""
    return min(1.0, max(0.0, 1.0 - ratio))


def k_mix_cost(mix: dict[int, float], best: str, arms: dict[str, Row], key: str) -> Row:
    """What an arm's steps at other k than the best fixed k's cost, read from its k mix (the
    engine does the same work for a step of one k whichever table or policy chose it): each
    such k's share of the arm's decoding time (``k_time_mix``) times that fixed k's measured
    loss (``key``: its paired figures over rounds or blocks). Steps at a k whose fixed arm was
    not run are not priced: their share is given apart, to be counted on the cautious side of
    each goal."""
    best_k = int(best.removeprefix("k"))
    cost = low = high = not_run = 0.0
    for k, share in mix.items():
        if k == best_k:
            continue
        if f"k{k}" not in arms:
            not_run += share
            continue
        figures = arms[f"k{k}"][key]
        interval = figures["median_ratio_interval"]
        cost += share * loss_of(figures["median_ratio"])
        low += share * loss_of(interval["high"])
        high += share * loss_of(interval["low"])
    return {"priced": cost, "priced_at_least": low, "priced_at_most": high,
            "share_at_k_not_run": round(not_run, 4)}  # fmt: skip


def k_at(table: list[list[int]], batch: int) -> int:
    """The k a table runs at one batch size (0 where no range holds it)."""
    return next((k for start, end, k in table if start <= batch <= end), 0)


def table_time_mix(table: list[list[int]], windows: list[Row]) -> dict[int, float]:
    """The k a table would run on the batch sizes this load's steps had, as shares of decoding
    time: each batch cell's steps (every arm's, pooled) at the table's k for the cell's mean
    batch, weighted by that k's mean step there (the cell's mean step where that k never ran)."""
    cells = pooled(windows)
    by_batch: dict[tuple[int, int], CellTotals] = {}
    for (_, low, high), totals in cells.items():
        by_batch[(low, high)] = by_batch.get((low, high), CellTotals()) + totals
    spent: dict[int, float] = {}
    for (low, high), totals in by_batch.items():
        if totals.steps <= 0:
            continue
        k = k_at(table, round(totals.requests / totals.steps))
        own = cells.get((k, low, high))
        step_s = own.seconds / own.steps if own and own.steps > 0 else totals.seconds / totals.steps
        spent[k] = spent.get(k, 0.0) + totals.steps * step_s
    total = sum(spent.values())
    return {k: round(v / total, 4) for k, v in sorted(spent.items())} if total else {}


def default_profile_table(meta: Row) -> list[list[int]] | None:
    """The table of the target's pure-decode profile (``profiles/h200-<target>-eagle3``, the
    profiler's default method), when there is one and the launch's measured table is another
    (the launches ran the fast profiler's in-flight one)."""
    path = ROOT / "profiles" / f"h200-{meta.get('target')}-eagle3.table.json"
    measured = (meta.get("measured_table") or {}).get("path")
    if not path.is_file() or (measured and Path(measured).name == path.name):
        return None
    return [list(r) for r in json.loads(path.read_text())["ranges"]]


def tables_by_k_mix(meta: Row, windows: list[Row], best: str, arms: dict[str, Row],
                    key: str, standing: list[list[int]] | None = None) -> Row:  # fmt: skip
    """vLLM's documented table, the measured one and the target's pure-decode profile's
    (``default_profile_table``) priced by the k they would run here, run as
    arms or not: a table at one load is the fixed k it picks there (steps at a k not run are not
    priced, their share given apart). ``standing``: the daemon's own table when its part ended
    inside a trial (its arm then ran the trial's table), priced the same way."""
    tables = {"documented": [[s, min(e, MAX_NUM_SEQS), k] for s, e, k in DOCUMENTED_EAGLE_TABLE
                             if s <= MAX_NUM_SEQS]}  # fmt: skip
    if (meta.get("measured_table") or {}).get("ranges"):
        tables["measured"] = meta["measured_table"]["ranges"]
    default = default_profile_table(meta)
    if default is not None:
        tables["measured_default_profile"] = default
    if standing is not None:
        tables["daemon_standing"] = standing
    out = {}
    for name, table in tables.items():
        mix = table_time_mix(table, windows)
        cost = k_mix_cost(mix, best, arms, key)
        out[name] = {"table": table, "k_time_mix": mix, "loss_from_k_mix": round(cost["priced"], 4),
                     "share_at_k_not_run": cost["share_at_k_not_run"]}  # fmt: skip
    return out


def daemon_by_k_mix(mix: dict[int, float], best: str, units: list[dict[str, float]],
                    key: str, arms: dict[str, Row]) -> Row:  # fmt: skip
    """The daemon's loss read from the k its steps ran (``k_mix_cost``, its steps at a k not
    run counted as lost whole), and bounds on the loss of its own k (the one it ran most) that
    do not lean on which fixed k is best: against every other fixed k run, 1 - the interval of
    the median of its fixed arm's tokens/s over that k's, unit by unit (order statistics, as
    for every paired figure), its steps at other k counted as lost whole in the upper bound."""
    cost = k_mix_cost(mix, best, arms, key)
    own = max(mix, key=lambda k: mix[k]) if mix else None
    if own is not None and own_arm_stands_in(mix, own, arms, key):
        return daemon_by_own_arm(mix, own, best, arms[DAEMON][key], cost)
    bounds: dict[str, float | None] = {"loss_upper_bound": None, "loss_lower_bound": None,
                                       "coverage": None}  # fmt: skip
    if own is not None and f"k{own}" in arms:
        intervals = [paired(units, f"k{own}", arm)["median_ratio_interval"]
                     for arm in arms if arm in FIXED and arm != f"k{own}"]  # fmt: skip
        known = [i for i in intervals if i is not None]
        bounds = {
            "loss_upper_bound": round(max([0.0, *(1.0 - i["low"] for i in known)])
                                      + 1.0 - mix[own], 4),
            "loss_lower_bound": round(max([0.0, *(1.0 - i["high"] for i in known)]), 4),
            "coverage": min((i["coverage"] for i in known), default=None),
        }  # fmt: skip
    best_k = int(best.removeprefix("k"))
    return {"share_at_best_k": mix.get(best_k, 0.0),
            "loss_from_k_mix": round(cost["priced"] + cost["share_at_k_not_run"], 4),
            "share_at_k_not_run": cost["share_at_k_not_run"],
            "own_k": own, "share_at_own_k": None if own is None else mix[own],
            **bounds}  # fmt: skip


def own_arm_stands_in(mix: dict[int, float], own: int, arms: dict[str, Row], key: str) -> bool:
    """The daemon's steps ran one k (``SINGLE_K`` of its time) whose fixed arm was not run:
    its arm, exploring off, is that fixed k's configuration, paired like one."""
    return (f"k{own}" not in arms and mix[own] >= SINGLE_K
            and key in arms.get(DAEMON, {}))  # fmt: skip


def daemon_by_own_arm(mix: dict[int, float], own: int, best: str, figures: Row,
                      cost: Row) -> Row:  # fmt: skip
    """The daemon priced by its own arm's tokens/s over the best fixed arm run's (``figures``:
    its paired figures): a k no fixed arm ran is not lost whole when the daemon's arm ran it;
    the loss is against the best of the fixed arms run and the daemon's own k."""
    interval = figures["median_ratio_interval"]
    return {"share_at_best_k": mix.get(int(best.removeprefix("k")), 0.0),
            "loss_from_k_mix": round(loss_of(figures["median_ratio"]), 4),
            "share_at_k_not_run": cost["share_at_k_not_run"],
            "own_k": own, "share_at_own_k": mix[own],
            "loss_upper_bound": round(loss_of(interval["low"]), 4),
            "loss_lower_bound": round(loss_of(interval["high"]), 4),
            "coverage": interval["coverage"],
            "priced_by": "its own arm (its one k ran as no fixed arm)"}  # fmt: skip


def daemon_exploring_by_k_mix(daemon_windows: list[Row], batch: int, best: str,
                              arms: dict[str, Row], key: str) -> Row:  # fmt: skip
    """The daemon as it serves, exploring on: its own windows (the part before the rotation)
    after its table last changed k at the load, priced by the k their steps ran as the bandit
    is (``k_mix_cost``; a k not run lost whole in the upper bound). Its arm in the rotation
    runs its table with exploring off; here its bursts count (but for each switch's first
    step, which no cell holds, so this reads low). The window that saw the last push may hold
    the old k's steps, so it is left out. The part is short (30 s in every launch): this
    prices the bursts that measure each k after a start, which stop once every k is
    measured."""
    viewed = [w for w in daemon_windows if w.get("view")]
    ks = [k_at(w["view"]["table"], batch) for w in viewed]
    first = len(viewed)
    while first > 0 and ks[first - 1] == ks[-1]:
        first -= 1
    settled = viewed[first + 1 :]
    out: Row = {"settled_at_s": viewed[first].get("since_daemon_start_s") if viewed else None,
                "until_s": viewed[-1].get("since_daemon_start_s") if viewed else None,
                "windows": len(settled)}  # fmt: skip
    if len(settled) < SETTLED_WINDOWS:
        why = f"settled at the load for fewer than {SETTLED_WINDOWS} windows"
        return {**out, "loss_from_k_mix": None, "note": why}
    mix = k_mix(pooled(settled), "seconds")
    cost = k_mix_cost(mix, best, arms, key)
    return {**out, "k_time_mix": mix, "loss_from_k_mix": round(cost["priced"], 4),
            "loss_lower_bound": round(cost["priced_at_least"], 4),
            "loss_upper_bound": round(cost["priced_at_most"] + cost["share_at_k_not_run"], 4),
            "share_at_k_not_run": cost["share_at_k_not_run"],
            "note": "the daemon's own windows after its table settled at the load until its "
                    "part ended (--daemon-s), exploring on: what the bursts measuring each k "
                    "after a start cost, not its cost after longer; a low reading, as a k "
                    "switch's first step (a single acceptance step at K too) is in no cell; not "
                    "in the same seconds as the arms: judged by its k mix only"}  # fmt: skip


def window_engine(w: Row) -> Row:
    """What the engine did in a window, from its raw row: its steps (vLLM's
    iteration_tokens_total count), mean decoding step (the plugin's cells: their seconds over
    their steps), prompt tokens per second and mean running batch."""
    counters = w.get("vllm") or {}
    decoding = sum(pooled([w]).values(), CellTotals())
    prompt = counters.get("vllm:prompt_tokens_total")
    return {
        "steps": counters.get("vllm:iteration_tokens_total_count"),
        "mean_step_ms": round(1000 * decoding.mean_s, 1) if decoding.steps else None,
        "prompt_tokens_per_s": None if prompt is None else round(prompt / w["wall_s"], 1),
        "mean_running": w["mean_running"],
    }


def window_line(w: Row) -> Row:
    """A window in run order: its round's place, arm, tokens/s, when it ran, what the engine
    did, and the GPU and the host then."""
    times = {key: w[key] for key in ("started_utc", "ended_utc") if key in w}
    return {"index": w["index"], "arm": w["arm"], "tokens_per_s": round(w["tokens_per_s"], 1),
            **times, "engine": window_engine(w), **logs_of(w)}  # fmt: skip


def logs_of(w: Row) -> Row:
    """The GPU, host and GC logs' figures of a window, those that were joined to it."""
    return {key: w[key] for key in ("gpu", "host", "gc") if key in w}


def figures(line: Row) -> dict[str, float | None]:
    """A window line's figures that a stall moves, by name (None: not known)."""
    gpu, host, engine = (line.get(key) or {} for key in ("gpu", "host", "engine"))
    gc = {GC_SHARE: line["gc"]["share"]} if "gc" in line else {}
    return {
        "tokens_per_s": line["tokens_per_s"],
        "gpu_utilization_pct": gpu.get("utilization_pct"),
        "mean_step_ms": engine["mean_step_ms"],
        "engine_steps": engine["steps"],
        "prompt_tokens_per_s": engine["prompt_tokens_per_s"],
        "mean_running": engine["mean_running"],
        **{name: host.get(name) for name in HOST_FIGURES},
        "host_busy_share": host.get("busy_share"),
        "host_steal_share": host.get("steal_share"),
        **gc,
    }


def pearson(pairs: list[tuple[float | None, float | None]]) -> Row:
    """Pearson's r over the pairs where both are known; r None with fewer than MIN_PAIRS of
    them or where either side does not vary."""
    kept = [(x, y) for x, y in pairs if x is not None and y is not None]
    r = None
    if len(kept) >= MIN_PAIRS:
        xs, ys = zip(*kept, strict=True)
        with contextlib.suppress(statistics.StatisticsError):  # a constant side
            r = round(statistics.correlation(xs, ys), 3)
    return {"r": r, "n": len(kept)}


def around_arm_medians(lines: list[Row], values: list[float | None]) -> list[float | None]:
    """Each window's value less the median of its arm's values: what a window adds to its
    arm's level (arms differ in k, so in tokens/s and step time alike)."""
    by_arm: dict[str, list[float]] = {}
    for line, value in zip(lines, values, strict=True):
        if value is not None:
            by_arm.setdefault(line["arm"], []).append(value)
    medians = {arm: statistics.median(known) for arm, known in by_arm.items()}
    return [None if value is None else value - medians[line["arm"]]
            for line, value in zip(lines, values, strict=True)]  # fmt: skip


def digits(name: str) -> int:
    return 3 if name in FRACTIONS else 1


def stalls(lines: list[Row]) -> Row:
    """A load's arm windows whose GPU was busy less than STALL_GPU_PCT (how many, which arms),
    tokens/s correlated with what a host-side stall moves (as measured, and within arms: both
    around their arm's median, since the arms' k set their own levels), and those figures'
    means in the stalled windows and the others. Host figures only where the host log was joined
    (host_load.csv, since 2026-12-01), the GPU's where the GPU log was; a note says which is
    missing."""
    rows = [figures(line) for line in lines]
    busy = [f["gpu_utilization_pct"] for f in rows]
    stalled = [i for i, pct in enumerate(busy) if pct is not None and pct < STALL_GPU_PCT]
    other = [i for i, pct in enumerate(busy) if pct is not None and pct >= STALL_GPU_PCT]
    with_gpu = bool(stalled or other)
    host_logged = any("host" in line for line in lines)
    known = [name for name in rows[0] if host_logged or name not in FROM_HOST_LOG]
    correlated = (*CORRELATED, *([GC_SHARE] if GC_SHARE in rows[0] else []))
    notes = [
        *([] if with_gpu else ["no GPU log for this run: GPU busy shares not known"]),
        *([] if host_logged else ["no host log for this run (host_load.csv): the engine "
                                  "core's CPU, its run-queue wait and steal not known"]),
    ]  # fmt: skip

    tokens = around_arm_medians(lines, [f["tokens_per_s"] for f in rows])

    def within(name: str) -> Row:
        figure = around_arm_medians(lines, [f[name] for f in rows])
        return pearson(list(zip(tokens, figure, strict=True)))

    def means(name: str) -> Row:
        return {group: mean_of([rows[i][name] for i in held], digits(name))
                for group, held in (("stalled", stalled), ("other", other))}  # fmt: skip

    return {
        "gpu_busy_below_pct": STALL_GPU_PCT,
        "windows": len(stalled) if with_gpu else None,
        "of_windows": len(lines),
        "by_arm": dict(Counter(lines[i]["arm"] for i in stalled)),
        "indices": [lines[i]["index"] for i in stalled],
        "pearson_r_of_tokens_per_s_with": {
            name: pearson([(f["tokens_per_s"], f[name]) for f in rows]) if name in known else None
            for name in correlated
        },
        "pearson_r_within_arms": {
            name: within(name) if name in known else None for name in correlated
        },
        "stalled_vs_other": {name: means(name) for name in known} if with_gpu else None,
        **({"note": "; ".join(notes)} if notes else {}),
    }


def trial_of_part(raw: Row, part: str) -> Row | None:
    """The trial in force when the daemon part stopped: as the driver recorded it, or (runs
    from before it did) read from the part's log tail. The daemon arm then ran its table."""
    recorded = raw.get("daemon_trials_at_stop", {}).get(part)
    if recorded is not None:
        return dict(recorded)
    return trial_at_stop(raw.get("daemon_log_tails", {}).get(part, []))


def load_report(raw: Row, part: str) -> Row | None:
    windows = [w for w in raw["windows"] if w["part"] == f"{part}-arms"]
    if not windows:
        return None
    arms: dict[str, Row] = {}
    for arm in dict.fromkeys(w["arm"] for w in windows):
        arms[arm] = arm_summary([w for w in windows if w["arm"] == arm])
    fixed = {arm: arms[arm] for arm in FIXED if arm in arms}
    best = max(fixed, key=lambda arm: fixed[arm]["mean"])
    rounds = by_round(windows)
    trial = trial_of_part(raw, f"{part}-daemon")
    planned_and_run = {"planned": raw["meta"].get("rounds"), "run": len(rounds)}
    per_block = raw["meta"].get("rounds_per_block", 1)
    blocks, left_out = whole_blocks(windows, per_block) if per_block > 1 else (None, 0)
    for name, arm in arms.items():
        arm["loss_vs_best_fixed_k"] = round(1.0 - arm["mean"] / fixed[best]["mean"], 4)
        spread = max(arm["relative_range"] or 0.0, fixed[best]["relative_range"] or 0.0)
        arm["spread_judged_against"] = spread
        arm["loss_is_a_result"] = name != best and abs(arm["loss_vs_best_fixed_k"]) > spread
        arm["paired"], arm["loss_is_a_result_paired"] = paired_loss(rounds, name, best)
        if blocks is not None:
            pair, arm["loss_is_a_result_blocks"] = paired_loss(blocks, name, best)
            arm["blocks"] = {"tokens_per_s": [round(b[name], 1) for b in blocks], **pair}
    convergence = [
        {
            "since_daemon_start_s": w.get("since_daemon_start_s"),
            "tokens_per_s": round(w["tokens_per_s"], 1),
            "mean_running": w["mean_running"],
            "table": w["view"]["table"] if w.get("view") else None,
            **logs_of(w),
        }
        for w in raw["windows"]
        if w["part"] == f"{part}-daemon"
    ]
    effective = statistics.fmean(a["mean_running"] for a in arms.values() if a["mean_running"])
    cells = {arm: pooled([w for w in windows if w["arm"] == arm]) for arm in arms}
    mix = {arm: k_mix(cells[arm]) for arm in arms}
    time_mix = {arm: k_mix(cells[arm], "seconds") for arm in arms}
    single: dict[int, list[str]] = {}
    for arm, shares in mix.items():
        if shares and max(shares.values()) >= SINGLE_K:
            single.setdefault(max(shares, key=lambda k: shares[k]), []).append(arm)
    alike = {
        f"k{k}": {
            "arms": names,
            "relative_range_of_means": relative_range([arms[n]["mean"] for n in names]),
            "paired_against_the_first": {n: paired(rounds, n, names[0]) for n in names[1:]},
        }
        for k, names in single.items()
        if len(names) > 1
    }
    for group in alike.values() if blocks is not None else ():
        names = group["arms"]
        group["blocks_against_the_first"] = {n: paired(blocks, n, names[0]) for n in names[1:]}
    rates = tuple(raw["meta"]["synthetic_rates"])
    decisions = replay(raw, rates=rates, load=round(effective), part=f"{part}-daemon")
    lines = [window_line(w) for w in windows]
    unit, units, key = ("block", blocks, "blocks") if blocks is not None else (
        "round", rounds, "paired")  # fmt: skip
    by_mix = {} if "daemon" not in arms else {
        "daemon_by_k_mix": daemon_by_k_mix(time_mix["daemon"], best, units, key, arms)}  # fmt: skip
    own = [w for w in raw["windows"] if w["part"] == f"{part}-daemon"]
    if own:
        reading = daemon_exploring_by_k_mix(own, round(effective), best, arms, key)
        span = (reading["settled_at_s"], reading["until_s"])
        if reading["loss_from_k_mix"] is not None and None not in span:
            holds = rollback_holds(raw, f"{part}-daemon")  # bursts sparse while one holds
            reading["inside_a_rollback_hold_s"] = round(overlap_s(span, holds), 1)
        by_mix["daemon_exploring_by_k_mix"] = reading
    # The bandit: an arm of the rotation, or (runs of blocks) its own windows after it.
    alone = [w for w in raw["windows"] if w["part"] == f"{part}-nightjar"]
    alone_cells = pooled(alone)
    bandit = time_mix.get(NIGHTJAR) or (k_mix(alone_cells, "seconds") if alone else None)
    if bandit:  # its steps at a k not run priced at nothing: the cautious side for its goal
        cost = k_mix_cost(bandit, best, arms, key)
        by_mix["nightjar_by_k_mix"] = {
            "loss_from_k_mix": round(cost["priced"], 4),
            "loss_lower_bound": round(cost["priced_at_least"], 4),
            "loss_upper_bound": round(cost["priced_at_most"] + cost["share_at_k_not_run"], 4),
            "share_at_k_not_run": cost["share_at_k_not_run"],
        }
    if alone:
        by_mix["nightjar_run"] = {
            "windows": len(alone),
            "tokens_per_s": round(statistics.fmean(w["tokens_per_s"] for w in alone), 1),
            "k_mix": k_mix(alone_cells),
            "k_time_mix": bandit,
            "note": "its own windows after the rotation, not in the same seconds as the arms: "
            "judged by its k mix only",
        }
    block_count = {} if blocks is None else {"blocks": {
        "rounds_per_block": per_block, "run": len(blocks),
        "left_out": left_out}}  # fmt: skip
    return {
        "effective_batch": round(effective, 1),
        "rounds": raw.get("rounds", {}).get(part, planned_and_run),
        **block_count,
        "best_fixed_k": best,
        "best_fixed_k_sign_test": best_identified(units, list(fixed), best, unit),
        "k_mix": mix,
        "k_time_mix": time_mix,
        "tables_by_k_mix": tables_by_k_mix(
            raw["meta"], windows, best, arms, key, None if trial is None else trial["standing"]
        ),
        **({} if trial is None else {"daemon_trial_at_stop": trial}),
        **by_mix,
        "arms_running_one_and_the_same_k": alike,
        "arms": arms,
        "model_check": model_check(windows, arms, rates),
        "daemon_table": raw.get("daemon_tables", {}).get(part),
        "windows": lines,
        "stalls": stalls(lines),
        "daemon_convergence": convergence,
        "replay_at_this_commit": {
            "note": "the daemon part's recorded step cells fed window by window into this "
            "checkout's estimator and decision (from the starting table, this load): what it "
            "would decide on the same counters; not a live run",
            "k_at_load": [d["k_at_load"] for d in decisions],
            "decisions": decisions,
        },
    }


def shape_change_report(raw: Row) -> Row | None:
    """Time until a new table was in force after the change, and the share of the gap
    (the table in force at the change -> the best fixed k, both measured rotated afterwards on
    the new traffic) that the daemon's windows recovered by 30, 60 and 90 s after it."""
    change = raw.get("shape_change")
    if not change or "at_s" not in change:
        return None
    part = change["part"]
    arms = [w for w in raw["windows"] if w["part"] == f"{part}-arms"]
    mean = {arm: statistics.fmean(w["tokens_per_s"] for w in arms if w["arm"] == arm)
            for arm in dict.fromkeys(w["arm"] for w in arms)}  # fmt: skip
    fixed = {arm: v for arm, v in mean.items() if arm in FIXED}
    # Each k's loss on the new traffic, by the fixed arms' means; a k not run counts as lost
    # whole (the cautious side: the daemon's recovery looks smaller, never larger).
    fixed_loss = {int(arm.removeprefix("k")): max(0.0, 1.0 - v / max(fixed.values()))
                  for arm, v in fixed.items()}  # fmt: skip

    def priced(mix: dict[int, float]) -> float | None:
        """A k mix's loss on the new traffic (a k no arm ran lost whole)."""
        return round(sum(share * fixed_loss.get(k, 1.0) for k, share in mix.items()), 4) if (
            mix and fixed) else None  # fmt: skip

    def mix_loss(windows: list[Row]) -> float | None:
        return priced(k_mix(pooled(windows), "seconds"))

    def table_loss(table: list[list[int]]) -> float | None:
        """A table priced on the new traffic: the k it runs on the rotated arms' batch cells."""
        return priced(table_time_mix(table, arms))

    after = [
        {
            "since_change_s": round(w["since_daemon_start_s"] - change["at_s"], 1),
            "tokens_per_s": round(w["tokens_per_s"], 1),
            "table": w["view"]["table"],
            "loss_from_k_mix": mix_loss([w]),
            "loss_from_table": table_loss(w["view"]["table"]),
        }
        for w in raw["windows"]
        if w["part"] == f"{part}-daemon" and w["since_daemon_start_s"] > change["at_s"]
    ]
    first_new = next((w["since_change_s"] for w in after
                      if w["table"] != change["table_at_change"]), None)  # fmt: skip
    shares: dict[str, float | None] = {}
    if fixed and "before" in mean and after:
        best, start = max(fixed.values()), mean["before"]
        for mark in (30, 60, 90):
            upto = [w for w in after if w["since_change_s"] <= mark + 1e-9]
            shares[f"{mark}s"] = (
                round((upto[-1]["tokens_per_s"] - start) / (best - start), 3)
                if upto and best > start
                else None
            )
    gap = mix_loss([w for w in arms if w["arm"] == "before"])
    table_gap = table_loss(change["table_at_change"])
    by_mix: dict[str, float | None] = {}
    by_table: dict[str, float | None] = {}
    for mark in (30, 60, 90):
        upto = [w for w in after if w["since_change_s"] <= mark + 1e-9]
        loss = upto[-1]["loss_from_k_mix"] if upto else None
        by_mix[f"{mark}s"] = (round(1.0 - loss / gap, 3)
                              if loss is not None and gap else None)  # fmt: skip
        in_force = upto[-1]["loss_from_table"] if upto else None
        by_table[f"{mark}s"] = (round(1.0 - in_force / table_gap, 3)
                                if in_force is not None and table_gap else None)  # fmt: skip
    return {
        **change,
        "windows_after_the_change": after,
        "arms_after_the_change": {arm: round(v, 1) for arm, v in mean.items()},
        "new_table_in_force_by_s": first_new,
        "share_of_gap_recovered": shares,
        "loss_from_k_mix_of_the_table_at_the_change": gap,
        "share_of_gap_recovered_by_k_mix": by_mix,
        "loss_from_table_at_the_change": table_gap,
        "share_of_gap_recovered_by_table": by_table,
        "note": "by the window ending at or before each mark; the gap is measured with single "
        "windows on both ends, so read it with the same-arm spread of the arms. By k mix: that "
        "window's steps, its exploring bursts included (a k no arm ran lost whole). By table: "
        "the daemon's table in force then, priced on the k it runs over the rotated arms' "
        "batch cells, as its arm is judged at every load (exploring off)",
    }


def shape_change_goal(change: Row | None) -> Row:
    target = "new table <= 60 s, >= 95 % of the gap in 90 s"
    if change is None:
        return not_run(target, "not run in this launch")
    new_by = change["new_table_in_force_by_s"]

    def judged(share: float | None) -> Row:
        measured = {"new_table_by_s": new_by, "share_at_90s": share}
        ok = new_by is not None and new_by <= 60 and share is not None and share >= 0.95
        return goal(measured, target, ok)

    by_mix = change.get("share_of_gap_recovered_by_k_mix", {}).get("90s")
    by_table = change.get("share_of_gap_recovered_by_table", {}).get("90s")
    return {
        **judged(change["share_of_gap_recovered"].get("90s")),
        "by_k_mix": {
            **judged(by_mix),
            "note": "the gap read from the k the steps ran: each window's steps at each k times "
            "that k's loss on the new traffic (the fixed arms' means after the change; a k not "
            "run lost whole), against the same for the table in force at the change",
        },
        "by_table": {
            **judged(by_table),
            "note": "the gap read from the daemon's table in force at 90 s against the table in "
            "force at the change, each priced on the k it runs over the rotated arms' batch "
            "cells after the change (a k not run lost whole): the daemon's table, as every "
            "load's daemon arm is judged; its exploring bursts are in by_k_mix",
        },
    }


def not_run(target: str, why: str) -> Row:
    return {"measured": None, "goal": target, "pass": None, "note": why}


def loads_of(meta: Row) -> list[Row]:
    """Each load's part, shape and clients (the first runs named loads by clients alone)."""
    return [
        load if isinstance(load, dict) else
        {"part": f"B{load}", "shape": meta["shape"], "clients": load}
        for load in meta["loads"]
    ]  # fmt: skip


def daemon_goal(shape: str, reports: list[Row], rounds_per_block: int = 1) -> Row:
    """The daemon's worst-load loss under one shape, judged only where the spread allows: on
    the means of its windows (paired per round beside them), or, in a run of interleaved
    blocks, on the blocks (those figures kept under ``windows_and_rounds``)."""
    losses = [r["arms"]["daemon"]["loss_vs_best_fixed_k"] for r in reports if "daemon" in r["arms"]]
    spreads = [r["arms"]["daemon"]["spread_judged_against"] for r in reports
               if "daemon" in r["arms"]]  # fmt: skip
    worst = max(losses, default=None)
    bound = 0.015 if shape == "decode-heavy" else 0.03
    windows = {
        **goal(worst, f"<= {bound:.1%}", worst is not None and worst <= bound),
        "largest_same_arm_spread": max(spreads, default=None),
        "judgeable": bool(spreads) and max(spreads) < bound,
        "paired": paired_goal(
            reports, bound, "paired", "paired_against_the_first",
            "per load, the median over rounds of the daemon's window over the best fixed k's "
            "window of the same round; judgeable when the largest range of those ratios is "
            "below the bound; two arms running one and the same k should differ by less than "
            "that too (largest_same_k_paired_difference, the null)",
        ),
    }  # fmt: skip
    by_mix = k_mix_goal(reports, bound)
    if rounds_per_block <= 1:
        return {**windows, "by_k_mix": by_mix}
    return {
        **paired_goal(
            reports, bound, "blocks", "blocks_against_the_first",
            f"per load, the median over blocks ({rounds_per_block} rounds each; an arm's "
            "tokens/s in a block: its windows' tokens over their seconds) of the daemon's over "
            "the best fixed k's (the fixed k whose windows' mean is highest, as without blocks); "
            "judgeable when the largest range of those ratios is below the bound; arms running "
            "one and the same k compared on blocks too (the null)",
        ),
        "unit": "block",
        "rounds_per_block": rounds_per_block,
        "by_k_mix": by_mix,
        "windows_and_rounds": windows,
    }  # fmt: skip


def k_mix_goal(reports: list[Row], bound: float) -> Row:
    """The daemon's worst loss over the loads read from its k mix (``daemon_by_k_mix``), and
    the worst of its bounds: judgeable when the upper bound is within the goal (passed however
    the windows of one and the same k scatter) or the lower bound beyond it (missed)."""
    mixes = [r["daemon_by_k_mix"] for r in reports if "daemon_by_k_mix" in r]
    worst = max((m["loss_from_k_mix"] for m in mixes), default=None)
    uppers = [m["loss_upper_bound"] for m in mixes]
    upper = None if not mixes or None in uppers else max(uppers)
    lower = max((m["loss_lower_bound"] or 0.0 for m in mixes), default=None)
    return {
        **goal(worst, f"<= {bound:.1%}", upper is not None and upper <= bound),
        "loss_upper_bound": upper,
        "loss_lower_bound": lower,
        "judgeable": (upper is not None and upper <= bound)
        or (lower is not None and lower > bound),
        "note": "per load, the share of the daemon's steps at another k than the best fixed k's "
        "times that k's measured loss; passed when the upper bound (against every other fixed "
        "k run, 1 - the low end of the interval of the median of the paired ratios of the "
        "fixed arm of the daemon's own k over it, plus the daemon's steps at other k counted "
        "as lost whole) is "
        "within the goal at every load; the fixed k compared are those run "
        "(best_fixed_k_sign_test.fixed_arms_run)",
    }


def paired_goal(reports: list[Row], bound: float, key: str, null_key: str, note: str) -> Row:
    """The daemon's worst paired loss over the loads, from each arm's ``key`` (rounds or
    blocks), judgeable when the largest range of its ratios is below ``bound``; the largest
    difference between arms running one and the same k (``null_key``), the null."""
    pairs = [r["arms"]["daemon"][key] for r in reports if "daemon" in r["arms"]]
    pairs = [p for p in pairs if p["loss_vs_best_fixed_k"] is not None]
    worst = max((p["loss_vs_best_fixed_k"] for p in pairs), default=None)
    spread = max((p["spread_of_ratios"] for p in pairs), default=None)
    nulls = [abs(1.0 - pair["median_ratio"]) for r in reports
             for group in r["arms_running_one_and_the_same_k"].values()
             for pair in group[null_key].values()
             if pair["median_ratio"] is not None]  # fmt: skip
    return {
        **goal(worst, f"<= {bound:.1%}", worst is not None and worst <= bound),
        "note": note,
        "largest_spread_of_ratios": spread,
        "largest_same_k_paired_difference": round(max(nulls), 4) if nulls else None,
        "judgeable": spread is not None and spread < bound,
    }


def nightjar_goal(reports: list[Row]) -> Row:
    """Issue 16: the Nightjar-style bandit's worst-load loss (the ``nightjar`` arm, run in the
    engine) is at least 3x the daemon's, both against their load's best fixed k, over the loads
    that ran both. Judgeable when the two losses differ by more than the largest same-arm
    spread of the arms compared."""
    target = f">= {NIGHTJAR_FACTOR:g}x the daemon's"
    by_mix = nightjar_k_mix_goal(reports, target)
    both = [r["arms"] for r in reports if NIGHTJAR in r["arms"] and "daemon" in r["arms"]]
    if not both:
        absent = not_run(target, "no load ran both the nightjar and the daemon arm in its "
                         "rotation (--arms; in a run of blocks the bandit runs apart)")  # fmt: skip
        return absent if by_mix is None else {**absent, "by_k_mix": by_mix}
    theirs = max(arms[NIGHTJAR]["loss_vs_best_fixed_k"] for arms in both)
    ours = max(arms["daemon"]["loss_vs_best_fixed_k"] for arms in both)
    spread = max(arms[name]["spread_judged_against"] for arms in both
                 for name in (NIGHTJAR, "daemon"))  # fmt: skip
    measured = {
        "nightjar_worst_load_loss": theirs,
        "daemon_worst_load_loss": ours,
        "ratio": round(theirs / ours, 2) if ours > 0 else None,
    }
    return {
        **goal(measured, target, theirs >= NIGHTJAR_FACTOR * max(ours, 0.0) and theirs > 0),
        "largest_same_arm_spread": spread,
        "judgeable": theirs - ours > spread,
        "by_k_mix": by_mix,
    }


def nightjar_k_mix_goal(reports: list[Row], target: str) -> Row | None:
    """The same comparison read from the two arms' k mixes (``nightjar_by_k_mix``,
    ``daemon_by_k_mix``): judgeable when the bandit's lower bound is at least 3x the daemon's
    upper bound (or the bandit's upper bound below 3x the daemon's lower bound: missed beyond
    doubt)."""
    both = [r for r in reports if "nightjar_by_k_mix" in r and "daemon_by_k_mix" in r]
    if not both:
        return None
    theirs = max(r["nightjar_by_k_mix"]["loss_from_k_mix"] for r in both)
    theirs_low = max(r["nightjar_by_k_mix"]["loss_lower_bound"] for r in both)
    theirs_up = max(r["nightjar_by_k_mix"]["loss_upper_bound"] for r in both)
    ours = max(r["daemon_by_k_mix"]["loss_from_k_mix"] for r in both)
    uppers = [r["daemon_by_k_mix"]["loss_upper_bound"] for r in both]
    ours_up = None if None in uppers else max(uppers)
    ours_low = max(r["daemon_by_k_mix"]["loss_lower_bound"] or 0.0 for r in both)
    measured = {
        "nightjar_worst_load_loss": theirs,
        "daemon_worst_load_loss": ours,
        "ratio": round(theirs / ours, 2) if ours > 0 else None,
    }
    passed = ours_up is not None and theirs_low > 0 and theirs_low >= NIGHTJAR_FACTOR * ours_up
    return {
        **goal(measured, target, theirs > 0 and theirs >= NIGHTJAR_FACTOR * ours),
        "nightjar_loss_lower_bound": theirs_low,
        "daemon_loss_upper_bound": ours_up,
        "judgeable": passed or theirs_up < NIGHTJAR_FACTOR * ours_low,
        "note": "the bandit's steps at a k whose fixed arm was not run priced at nothing "
        "(nightjar_by_k_mix.share_at_k_not_run), the daemon's at all they could lose",
    }


def log_text(path: Path) -> str:
    """A log's text; one kept gzipped under bench/results/gpu_raw (``.gz``, so the tree stays
    small enough to travel to the GPU host beside the vLLM bundle) is read through gzip."""
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode()
    return path.read_text()


def log_name(path: Path) -> str:
    """The log's name as the job wrote it (without the ``.gz`` it is kept under)."""
    return path.name.removesuffix(".gz")


def with_clocks(raw: Row, clocks: Path, gpus: set[int] | None) -> Row:
    """``raw``'s windows annotated in place with the GPU log's samples inside them; what was
    read and how it was aligned."""
    offset = (raw["meta"].get("gpu_clocks") or {}).get("utc_offset") or "+0000"
    alignment = annotate(raw, read_clocks(log_text(clocks), offset), gpus)
    return {"path": log_name(clocks), "utc_offset": offset, **alignment}


def with_host_load(raw: Row, path: Path) -> Row:
    """``raw``'s windows annotated in place with the host log's samples wholly inside them;
    what was read and how it was aligned."""
    return {"path": log_name(path), **annotate_host(raw, read_host_load(log_text(path)))}


def with_step_trace(result: Row, raw: Row, text: str) -> Row:
    """``result`` with each load's ``daemon_exploring_by_trace``: its daemon part's exploring
    cost step by step from the engine's step trace (step_trace_report.exploring_cost: every
    step's kept tokens in expectation over its time against the table's k's own steps, the
    switch steps the cells leave out included; the k mix reads low without them)."""
    for entry in exploring_cost(raw, read_trace(text)):
        load = entry["part"].removesuffix("-daemon")
        if load in result["loads"]:
            result["loads"][load]["daemon_exploring_by_trace"] = entry
    return result


def with_gc_log(raw: Row, path: Path) -> Row:
    """``raw``'s windows annotated in place with the engine core's garbage collections logged
    wholly inside them; what was read and how it was aligned."""
    return {"path": log_name(path), **annotate_gc(raw, read_for_run(raw, log_text(path)))}


def beside(raw_path: Path, meta: Row, log: str) -> Path | None:
    """The log the job wrote beside its raw file (meta.gpu_clocks, meta.host_load,
    meta.gc_log), when it is there."""
    named = (meta.get(log) or {}).get("path")
    if not named:
        return None
    for path in (raw_path.parent / named, raw_path.parent / f"{named}.gz"):
        if path.is_file():
            return path
    return None


def report(
    raw: Row, clocks: Row | None = None, host: Row | None = None, gc: Row | None = None
) -> Row:
    meta = raw["meta"]
    loads = {load["part"]: load_report(raw, load["part"]) for load in loads_of(meta)}
    shapes = {load["part"]: load["shape"] for load in loads_of(meta)}
    measured = {name: r for name, r in loads.items() if r is not None}
    change = shape_change_report(raw)
    by_shape: dict[str, list[Row]] = {}
    for name, r in measured.items():
        by_shape.setdefault(shapes[name], []).append(r)
    return {
        "meta": meta,
        "loads": loads,
        "goals": {
            **{
                f"daemon_worst_load_loss_{shape.replace('-', '_')}": daemon_goal(
                    shape, reports, meta.get("rounds_per_block", 1)
                )
                for shape, reports in by_shape.items()
            },
            "nightjar_style_loss_3x_daemon": nightjar_goal(list(measured.values())),
            "shape_change": shape_change_goal(change),
        },
        "shape_change": change,
        "gpu_clocks": clocks,
        "host_load": host,
        **({"gc_log": gc} if gc is not None else {}),
        "errors": raw["errors"],
        "skipped": raw["skipped"],
        "durations_s": raw["durations_s"],
    }


def plot(result: Row, path: Path) -> None:
    """Per load each arm's mean tokens/s (bars: min..max of its windows); in a run of blocks a
    panel of each arm's block ratios to the best fixed k (dots) and the interval of their
    median (line), the figure its loss is judged on; with a shape change, a panel of the
    daemon's loss after it. Nothing is drawn for a launch with neither."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = {name: r for name, r in result["loads"].items() if r is not None}
    blocks = {name: r for name, r in loads.items() if "blocks" in r}
    change = result.get("shape_change")
    panels = (1 if loads else 0) + (1 if blocks else 0) + (1 if change else 0)
    if not panels:
        return
    fig, axes = plt.subplots(1, panels, figsize=(5 + 4 * panels, 4), squeeze=False)
    if loads:
        plot_loads(axes[0][0], result, loads)
    if blocks:
        plot_blocks(axes[0][1], blocks, list(next(iter(loads.values()))["arms"]))
    if change:
        plot_change(axes[0][panels - 1], change, result["meta"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_loads(ax: Any, result: Row, loads: dict[str, Row]) -> None:
    """Per load each arm's mean tokens/s, bars from the lowest to the highest window."""
    arms = list(next(iter(loads.values()))["arms"])
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        xs = [j + i * width for j in range(len(loads))]
        means = [r["arms"][arm]["mean"] if arm in r["arms"] else 0 for r in loads.values()]
        lows = [m - min(r["arms"][arm]["tokens_per_s"]) if arm in r["arms"] else 0
                for m, r in zip(means, loads.values(), strict=True)]  # fmt: skip
        highs = [max(r["arms"][arm]["tokens_per_s"]) - m if arm in r["arms"] else 0
                 for m, r in zip(means, loads.values(), strict=True)]  # fmt: skip
        ax.bar(xs, means, width, yerr=[lows, highs], label=arm, capsize=2)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(loads))])
    ax.set_xticklabels([f"{n} (B~{r['effective_batch']:.0f})" for n, r in loads.items()])
    ax.set_ylabel("tokens/s (bars: min..max of repeated windows)")
    meta = result["meta"]
    shape_of = {load["part"]: load["shape"] for load in loads_of(meta)}
    shapes = ", ".join(dict.fromkeys(shape_of[name] for name in loads))  # of the loads drawn
    ax.set_title(f"{meta.get('target', 'qwen3-4b')}, {shapes} traffic, "
                 f"{meta.get('device', '?')}, vLLM {meta.get('engine_version', '?')}, "
                 f"{meta['date'][:10]}", fontsize=9)  # fmt: skip
    ax.legend(fontsize=7, ncol=4)


def plot_change(ax: Any, change: Row, meta: Row) -> None:
    """The daemon's loss after the change against the best fixed k on the new traffic: by the
    table in force (as it is judged) and by the k its steps ran (bursts included), with the
    gap (the table at the change) and the goal's line (95 % of it recovered)."""
    after = change["windows_after_the_change"]
    xs = [w["since_change_s"] for w in after]
    for key, style, label in (("loss_from_table", "-", "by the table in force"),
                              ("loss_from_k_mix", ".", "by the k its steps ran")):  # fmt: skip
        ys = [w.get(key) for w in after]
        ax.plot([x for x, y in zip(xs, ys, strict=True) if y is not None],
                [100 * y for y in ys if y is not None], style, label=label,
                drawstyle="steps-post" if style == "-" else "default")  # fmt: skip
    gap = change.get("loss_from_table_at_the_change")
    if gap:
        ax.axhline(100 * gap, color="grey", ls="--", lw=0.8, label="the table at the change")
        ax.axhline(5 * gap, color="green", ls=":", lw=0.8, label="95 % of the gap recovered")
    if change.get("new_table_in_force_by_s") is not None:
        ax.axvline(change["new_table_in_force_by_s"], color="C2", lw=0.8, label="new table")
    for mark in (30, 60, 90):
        ax.axvline(mark, color="grey", lw=0.5, alpha=0.5)
    ax.set_xlabel("seconds since the change")
    ax.set_ylabel("% below the best fixed k on the new traffic")
    ax.set_title(f"shape change {change.get('before')} -> {change.get('after')} "
                 f"({change.get('clients')} clients), {meta.get('date', '?')[:16]}",
                 fontsize=9)  # fmt: skip
    ax.legend(fontsize=7)


def plot_blocks(ax: Any, loads: dict[str, Row], arms: list[str]) -> None:
    """Each arm's block ratios to its load's best fixed k, and the interval of their median."""
    for j, (name, r) in enumerate(loads.items()):
        for i, arm in enumerate(arms):
            mine = r["arms"].get(arm, {}).get("blocks")
            if not mine or not mine["ratios"]:
                continue
            x = j * (len(arms) + 1) + i
            ax.plot([x] * len(mine["ratios"]), mine["ratios"], "o", ms=3, alpha=0.6,
                    color=f"C{i}", label=arm if j == 0 else None)  # fmt: skip
            interval = mine["median_ratio_interval"]
            ax.plot([x, x], [interval["low"], interval["high"]], "-", lw=4, alpha=0.4,
                    color=f"C{i}")  # fmt: skip
        ax.text(j * (len(arms) + 1), ax.get_ylim()[0], f" {name}", fontsize=7, va="bottom")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks([])
    ax.set_ylabel("tokens/s over the best fixed k's, per block\n(line: interval of the median)")
    ax.set_title(f"blocks of {next(iter(loads.values()))['blocks']['rounds_per_block']} "
                 "rounds: every arm in the same seconds", fontsize=9)  # fmt: skip
    ax.legend(fontsize=7, ncol=4)


def report_name(meta: Row, name: str | None) -> str:
    """eval_traffic_<name, else the run's shape>_<GPU>.json, the GPU read from meta.device
    ("NVIDIA H100 80GB HBM3, ..." -> h100): the H200 summary reads *_h200.json alone, and a
    launch that got another card must not join it."""
    model = re.search(r"\b([A-Z]\d{2,4})\b", str(meta.get("device", "")).upper())
    gpu = model.group(1).lower() if model else "gpu"
    return f"eval_traffic_{name or meta['shape'].replace('-', '_')}_{gpu}.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw")
    parser.add_argument("--out", default=None)
    parser.add_argument("--name", default=None, help="eval_traffic_NAME_<GPU>.json (default: "
                        "the --shape of the run)")  # fmt: skip
    parser.add_argument("--gpu-clocks", default=None,
                        help="the GPUs' once-a-second log (nvidia-smi CSV; default: the one the "
                        "job wrote beside RAW, when there)")  # fmt: skip
    parser.add_argument("--gpu-index", default=None,
                        help="the job's GPU indices in that log, comma-separated (default: "
                        "meta.gpu_clocks.job_gpus, else every GPU)")  # fmt: skip
    parser.add_argument("--host-load", default=None,
                        help="the host's once-a-second CPU log (host_logger.py's CSV; default: "
                        "the one the job wrote beside RAW, when there)")  # fmt: skip
    parser.add_argument("--step-trace", default=None,
                        help="the engine's step trace (STEP_TRACE=1's step_trace.<pid>.csv.gz): "
                        "each daemon part's exploring cost step by step")  # fmt: skip
    parser.add_argument("--gc-log", default=None,
                        help="vLLM's garbage-collection lines (GC_DEBUG=1's gc_log.txt; default: "
                        "the one the job wrote beside RAW, when there)")  # fmt: skip
    args = parser.parse_args()
    raw_path = Path(args.raw)
    raw = json.loads(raw_path.read_text())
    index = args.gpu_index or (raw["meta"].get("gpu_clocks") or {}).get("job_gpus")

    def joined(flag: str, given: str | None, key: str, join: Callable[[Path], Row]) -> Row | None:
        """The log named by ``flag``, else the one the job wrote beside RAW (meta ``key``),
        joined to the windows; None when there is none; a bad one is a one-line error."""
        path = Path(given) if given else beside(raw_path, raw["meta"], key)
        if path is None:
            return None
        try:
            return join(path)
        except (OSError, ValueError) as error:
            parser.error(f"{flag} {path}: {error}")

    clocks = joined("--gpu-clocks", args.gpu_clocks, "gpu_clocks",
                    lambda path: with_clocks(raw, path, job_gpus(index)))  # fmt: skip
    host = joined("--host-load", args.host_load, "host_load",
                  lambda path: with_host_load(raw, path))  # fmt: skip
    gc = joined("--gc-log", args.gc_log, "gc_log", lambda path: with_gc_log(raw, path))
    result = report(raw, clocks, host, gc)
    if args.step_trace:
        try:
            result = with_step_trace(result, raw, trace_text(Path(args.step_trace)))
        except (OSError, ValueError) as error:
            parser.error(f"--step-trace {args.step_trace}: {error}")
    name = report_name(raw["meta"], args.name)
    out = Path(args.out) if args.out else ROOT / "bench/results" / name
    out.write_text(json.dumps(result, indent=1) + "\n")
    with contextlib.suppress(ImportError):  # no matplotlib on the GPU host: drawn here later
        plot(result, out.with_suffix(".png"))
    print(json.dumps(result["goals"], indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
