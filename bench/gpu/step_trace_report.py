"""Steps one by one, from an engine's step trace (``STEP_TRACE=1``: one line per scheduler step,
src/tabletune/plugin/step_trace.py) beside an eval_traffic.py run's windows: what a step that
takes prompts in costs over one that only decodes, whether per prompt or once per such step,
and how often such steps come in a k's own run (a fixed arm) and in its bursts inside another
k's run (a daemon window's k with fewer steps than its busiest).

A step's duration is the gap from the line before (the step timer's reading: async scheduling
runs the next step while this one's results are handled), counted only when the engine ran back
to back (the line before scheduled tokens and left requests) and at the k of the decoding step
before it (a switch step is timed apart, as the plugin does). A step takes prompts in when it
schedules requests new to the engine or more tokens than its decodes and drafts
(tokens - batch - draft tokens > 0: a prompt's chunk rides along). ``exploring_cost`` prices
each daemon part's steps one by one (the switch steps the cells leave out included) against the
table's k's own steps: what exploring cost as served.

    .venv/bin/python bench/gpu/step_trace_report.py RAW.json TRACE.csv.gz \\
        --out bench/results/step_trace_h200.json
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import itertools
import json
import statistics
import sys
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from live_daemon_report import overlap_s, rollback_holds  # noqa: E402  (this folder: sys.path)

from tabletune.solver import tau  # noqa: E402
from tabletune.step_cells import cell_label, cell_of  # noqa: E402

Row = dict[str, Any]
MIN_STEPS = 100  # a group with fewer timed steps is not summarised
FIXED_ARMS = {"k0": 0, "k1": 1, "k2": 2, "k3": 3}
DRAFTS_NEXT = 8  # the trace's column of the drafts a step made for the next


@dataclass(frozen=True, slots=True)
class Step:
    """A timed step: when its results were ready, what it scheduled, how long it took."""

    time_s: float
    batch: int
    k: int
    prefill_tokens: int  # tokens beyond the decodes and drafts: prompts' chunks less one each
    new_requests: int
    seconds: float

    @property
    def takes_prompts(self) -> bool:
        return self.new_requests > 0 or self.prefill_tokens > 0


def read_trace(text: str) -> list[tuple[float, ...]]:
    """The trace's lines as numbers, in the header's order."""
    rows = [row for row in csv.reader(io.StringIO(text)) if row]
    return [tuple(float(v) for v in row) for row in rows[1:]]


def drafts_made(lines: Sequence[tuple[float, ...]]) -> list[int]:
    """Per line, the drafts its step made for the next: the trace's own column, or in a trace
    from before it had one, the k the next line verified (the last line: its own k)."""
    if lines and len(lines[0]) > DRAFTS_NEXT:
        return [int(line[DRAFTS_NEXT]) for line in lines]
    ks = [int(line[2]) for line in lines]
    return ks[1:] + ks[-1:]


def ran_back_to_back(before: Sequence[float], line: Sequence[float]) -> bool:
    """The line's step followed the one before at once: that one scheduled tokens and left
    requests behind, and this one scheduled tokens (its gap is its duration)."""
    return before[4] > 0 and not before[7] and line[4] > 0


def decodes(line: Sequence[float]) -> bool:
    """The step verified drafts or some request in it was not new (not only prompts)."""
    return line[2] > 0 or line[5] < line[1]


def timed_steps(lines: Sequence[tuple[float, ...]], *, rule: str = "drafts") -> Iterator[Step]:
    """The steps the step timer times, each with its duration (see the module's text). By
    ``rule``: "drafts", the plugin's (a step counts at k when it verified and drafted k);
    "verified", the plugin's before (a step verifying another k than the decoding step before
    it is a switch), to show what that read."""
    if rule not in ("drafts", "verified"):
        raise ValueError(f"rule must be drafts or verified, got {rule!r}")
    made = drafts_made(lines)
    last_k: int | None = None
    for i, (before, line) in enumerate(itertools.pairwise(lines), start=1):
        t, batch, k, drafts, tokens, new = line[:6]
        if not ran_back_to_back(before, line):
            last_k = None
            continue
        if not decodes(line):  # every request new: only prompts (no k applies)
            continue
        previous, last_k = last_k, int(k)
        switch = made[i] != k if rule == "drafts" else previous is not None and previous != k
        if switch:
            continue
        prefill = max(0, int(tokens - batch - drafts))
        yield Step(t, int(batch), int(k), prefill, int(new), t - before[0])


def window_bounds(window: Row) -> tuple[float, float]:
    return (
        datetime.fromisoformat(window["started_utc"]).timestamp(),
        datetime.fromisoformat(window["ended_utc"]).timestamp(),
    )


def steps_by_window(
    steps: Sequence[Step], windows: Iterable[Row]
) -> Iterator[tuple[Row, list[Step]]]:
    """Each window with the steps whose results came inside it."""
    ordered = sorted(steps, key=lambda s: s.time_s)
    times = [s.time_s for s in ordered]
    for window in windows:
        start, end = window_bounds(window)
        yield window, ordered[bisect_left(times, start) : bisect_left(times, end)]


def load_of(part: str) -> str:
    return part.rsplit("-", 1)[0]


def grouped(
    steps: Sequence[Step], windows: Iterable[Row]
) -> dict[tuple[str, str, int, str], list[Step]]:
    """(load, run or burst, k, batch cell) -> steps. A fixed arm's steps at its k are a run; in
    a daemon window the cell's busiest k runs and the others are bursts."""
    groups: dict[tuple[str, str, int, str], list[Step]] = defaultdict(list)
    for window, inside in steps_by_window(steps, windows):
        load = load_of(window["part"])
        arm_k = FIXED_ARMS.get(window["arm"])
        by_cell: dict[tuple[int, int], list[Step]] = defaultdict(list)
        for step in inside:
            by_cell[cell_of(step.batch)].append(step)
        for cell, cell_steps in by_cell.items():
            if arm_k is not None:
                runner = arm_k
            elif window["part"].endswith("-daemon"):
                counts: dict[int, int] = defaultdict(int)
                for step in cell_steps:
                    counts[step.k] += 1
                runner = max(counts, key=lambda k: counts[k])
            else:
                continue
            for step in cell_steps:
                if arm_k is not None and step.k != arm_k:
                    continue
                kind = "run" if step.k == runner else "burst"
                groups[(load, kind, step.k, cell_label(cell))].append(step)
    return groups


def _mean_ms(steps: Sequence[Step]) -> float | None:
    return round(1e3 * statistics.fmean(s.seconds for s in steps), 3) if steps else None


def least_squares(rows: Sequence[Sequence[float]], targets: Sequence[float]) -> list[float] | None:
    """Coefficients of the linear fit (normal equations); None when they are singular."""
    a = np.asarray(rows, dtype=float).reshape(len(rows), -1)
    b = np.asarray(targets, dtype=float)
    if a.shape[0] <= a.shape[1] or np.linalg.matrix_rank(a) < a.shape[1]:
        return None
    return [float(v) for v in np.linalg.lstsq(a, b, rcond=None)[0]]


def _named(fit: list[float] | None, names: Sequence[str]) -> Row | None:
    return None if fit is None else {n: round(v, 3) for n, v in zip(names, fit, strict=True)}


def summary(steps: Sequence[Step]) -> Row:
    """What the steps took: pure decodes against steps taking prompts in, by prompts taken, and
    fits of the step's milliseconds on (1, takes prompts, new requests) and on (1, takes prompts,
    prefill tokens / 100): a cost once per such step shows in the second term, one per prompt
    or per prompt token in the third (new requests and their tokens go together too closely
    for one fit of both)."""
    pure = [s for s in steps if not s.takes_prompts]
    taking = [s for s in steps if s.takes_prompts]
    by_new: Row = {}
    for label, chosen in (
        ("0", [s for s in steps if s.new_requests == 0]),
        ("1", [s for s in steps if s.new_requests == 1]),
        ("2", [s for s in steps if s.new_requests == 2]),
        ("3+", [s for s in steps if s.new_requests >= 3]),
    ):
        by_new[label] = {"steps": len(chosen), "mean_ms": _mean_ms(chosen)}
    millis = [1e3 * s.seconds for s in steps]
    takes = [float(s.takes_prompts) for s in steps]
    per_request = least_squares(
        [(1.0, t, float(s.new_requests)) for t, s in zip(takes, steps, strict=True)], millis
    )
    per_token = least_squares(
        [(1.0, t, s.prefill_tokens / 100) for t, s in zip(takes, steps, strict=True)], millis
    )
    pure_ms, taking_ms = _mean_ms(pure), _mean_ms(taking)
    return {
        "steps": len(steps),
        "mean_ms": _mean_ms(steps),
        "mean_batch": round(statistics.fmean(s.batch for s in steps), 2),
        "share_taking_prompts": round(len(taking) / len(steps), 4),
        "new_requests_per_step": round(statistics.fmean(s.new_requests for s in steps), 4),
        "prefill_tokens_per_step": round(statistics.fmean(s.prefill_tokens for s in steps), 2),
        "pure_decode_ms": pure_ms,
        "taking_prompts_ms": taking_ms,
        "extra_ms_when_taking_prompts": None
        if pure_ms is None or taking_ms is None
        else round(taking_ms - pure_ms, 3),
        "by_new_requests": by_new,
        "fit_ms_per_request": _named(per_request, ("base", "per_step_taking", "per_new_request")),
        "fit_ms_per_token": _named(
            per_token, ("base", "per_step_taking", "per_100_prefill_tokens")
        ),
    }


def burst_against_run(groups: dict[tuple[str, str, int, str], Row]) -> list[Row]:
    """Per burst group, its run at the same load, k and cell: the means, and what the run's
    mean would be from the burst's pure decodes and per-prompt-step cost at the run's share of
    steps taking prompts (a step-composition correction)."""
    out: list[Row] = []
    for (load, kind, k, cell), burst in sorted(groups.items()):
        run = groups.get((load, "run", k, cell))
        if kind != "burst" or run is None:
            continue
        extra = burst["extra_ms_when_taking_prompts"]
        pure = burst["pure_decode_ms"]
        corrected = (
            None
            if extra is None or pure is None
            else round(pure + run["share_taking_prompts"] * extra, 3)
        )
        out.append({
            "load": load, "k": k, "cell": cell,
            "burst_ms": burst["mean_ms"], "run_ms": run["mean_ms"],
            "burst_over_run": round(burst["mean_ms"] / run["mean_ms"], 4),
            "burst_share_taking_prompts": burst["share_taking_prompts"],
            "run_share_taking_prompts": run["share_taking_prompts"],
            "burst_pure_ms": pure, "run_pure_ms": run["pure_decode_ms"],
            "corrected_ms": corrected,
            "corrected_over_run":
                None if corrected is None else round(corrected / run["mean_ms"], 4),
        })  # fmt: skip
    return out


def by_verified_and_drafted(lines: Sequence[tuple[float, ...]]) -> list[Row]:
    """Every back-to-back decoding step by its batch cell, the k it verified and the k it
    drafted for the next step: what the step's time follows (groups of 20 steps or more)."""
    made = drafts_made(lines)
    times: dict[tuple[int, int, int], list[float]] = defaultdict(list)  # (cell's low, k, drafted)
    for i, (before, line) in enumerate(itertools.pairwise(lines), start=1):
        t, batch, k = line[:3]
        if ran_back_to_back(before, line) and decodes(line):
            times[(cell_of(int(batch))[0], int(k), made[i])].append(1e3 * (t - before[0]))
    return [
        {"cell": cell_label(cell_of(low)), "verified": k, "drafted": drafted, "steps": len(ms),
         "mean_ms": round(statistics.fmean(ms), 3), "median_ms": round(statistics.median(ms), 3)}
        for (low, k, drafted), ms in sorted(times.items())
        if len(ms) >= 20
    ]  # fmt: skip


def table_k_at(table: Sequence[Sequence[int]] | None, batch: int) -> int | None:
    return next((k for start, end, k in table or () if start <= batch <= end), None)


BOOTSTRAP_DRAWS = 2000


def table_k_loss(sums: np.ndarray) -> float:
    """1 - (all steps' kept tokens per second) / (the table k's steps')."""
    kept, seconds, table_kept, table_seconds = sums
    return float(1 - (kept / seconds) / (table_kept / table_seconds))


def _bootstrap(per_window: np.ndarray) -> list[float] | None:
    """The 2.5 and 97.5 percentiles of the loss over windows drawn with replacement (a fixed
    seed: the report is the same every run)."""
    if len(per_window) < 2:
        return None
    draws = np.random.default_rng(0).integers(
        0, len(per_window), (BOOTSTRAP_DRAWS, len(per_window))
    )
    sums = per_window[draws].sum(axis=1)
    ok = (sums[:, 1] > 0) & (sums[:, 3] > 0)
    losses = 1 - (sums[ok, 0] / sums[ok, 1]) / (sums[ok, 2] / sums[ok, 3])
    low, high = np.percentile(losses, [2.5, 97.5])
    return [round(float(low), 4), round(float(high), 4)]


def exploring_cost(raw: Row, lines: Sequence[tuple[float, ...]]) -> list[Row]:
    """``exploring_parts``' rows."""
    return [row for row, _ in exploring_parts(raw, lines)]


def exploring_parts(raw: Row, lines: Sequence[tuple[float, ...]]) -> list[tuple[Row, np.ndarray]]:
    """Per daemon part, from the windows after its table last changed at the load on: every
    back-to-back decoding step's kept tokens in expectation (its decoding requests times
    tau of the k it verified, at the launch's synthetic acceptance) over its time, against the
    same for the steps that ran the table's k through and through (verified and drafted it):
    what exploring cost as served, switch steps included, which the cells (and a k mix read
    from them) leave out. Also the share of time and the goodput of each kind of step. Each
    row comes with its windows' sums (kept tokens and seconds of all steps, then of the table
    k's steps; one row a window), which a pooled reading resamples."""
    rates = raw["meta"].get("synthetic_rates")
    if not rates:  # acceptance not synthetic: the kept tokens are not known step by step
        return []
    made = drafts_made(lines)
    out: list[tuple[Row, np.ndarray]] = []
    parts = sorted({w["part"] for w in raw["windows"] if w["part"].endswith("-daemon")})
    for part in parts:
        windows = [w for w in raw["windows"] if w["part"] == part and w.get("view")]
        if not windows:
            continue
        batch = round(statistics.median(w["mean_running"] for w in windows))
        ks = [table_k_at(w["view"]["table"], batch) for w in windows]
        first = len(windows)
        while first > 0 and ks[first - 1] == ks[-1]:
            first -= 1
        settled = windows[first + 1 :]
        table_k = ks[-1]
        if not settled or table_k is None:
            continue
        bounds = [window_bounds(w) for w in settled]
        starts = [start for start, _ in bounds]
        kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # steps, s, tokens
        # per window: all steps' kept tokens and seconds, and the table k's steps' (bootstrap)
        per_window = np.zeros((len(settled), 4))
        for i, (before, line) in enumerate(itertools.pairwise(lines), start=1):
            t, size, k, _drafts, _tokens, new = line[:6]
            at = bisect_right(starts, t) - 1
            if at < 0 or t >= bounds[at][1]:
                continue
            if not (ran_back_to_back(before, line) and decodes(line)):
                continue
            verified, drafted = int(k), made[i]
            if verified == drafted:
                kind = "table k" if verified == table_k else f"steady k={verified}"
            else:
                kind = f"switch {verified}->{drafted}"
            seconds, kept = t - before[0], (size - new) * tau(rates, verified)
            sums = kinds[kind]
            sums[0] += 1
            sums[1] += seconds
            sums[2] += kept
            per_window[at] += (kept, seconds, *((kept, seconds) if kind == "table k" else (0, 0)))
        totals = per_window.sum(axis=0)
        steady = kinds.get("table k")
        if not steady or not totals[1]:
            continue
        rate = steady[2] / steady[1]
        span = (settled[0].get("since_daemon_start_s"), settled[-1].get("since_daemon_start_s"))
        held = None if None in span else overlap_s(span, rollback_holds(raw, part))
        out.append(({
            "part": part, "table_k": table_k, "batch": batch,
            "from_s": span[0], "until_s": span[1],
            # read while a rollback held pushes: bursts sparse then, not the usual price
            "inside_a_rollback_hold_s": None if held is None else round(held, 1),
            "windows": len(settled),
            "steps": int(sum(v[0] for v in kinds.values())),
            "loss_against_the_table_k_steps": round(table_k_loss(totals), 4),
            "bootstrap_95": _bootstrap(per_window),
            "kinds": {
                kind: {"steps": int(n), "time_share": round(s / totals[1], 4),
                       "goodput_over_table_k": round(tok / s / rate, 4)}
                for kind, (n, s, tok) in sorted(kinds.items(), key=lambda kv: -kv[1][1])
            },
        }, per_window))  # fmt: skip
    return out


def by_rule(raw: Row, lines: Sequence[tuple[float, ...]], rule: str) -> Row:
    steps = list(timed_steps(lines, rule=rule))
    groups = {
        key: summary(chosen)
        for key, chosen in grouped(steps, raw["windows"]).items()
        if len(chosen) >= MIN_STEPS
    }
    return {
        "timed_steps": len(steps),
        "groups": [
            {"load": load, "kind": kind, "k": k, "cell": cell, **row}
            for (load, kind, k, cell), row in sorted(groups.items())
        ],
        "burst_against_run": burst_against_run(groups),
    }


def report(raw: Row, trace_text: str) -> Row:
    """Steps by what they verified and drafted, and runs and bursts as the plugin counts them
    (``drafts``) and as it counted them before (``verified``)."""
    lines = read_trace(trace_text)
    return {
        "meta": {
            key: raw["meta"].get(key) for key in ("device", "engine_version", "commit", "date")
        },
        "trace_lines": len(lines),
        "by_verified_and_drafted": by_verified_and_drafted(lines),
        "rules": {rule: by_rule(raw, lines, rule) for rule in ("drafts", "verified")},
        "exploring_cost": exploring_cost(raw, lines),
    }


def trace_text(path: Path) -> str:
    """A trace file's text, gzipped or not."""
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode("ascii")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("raw", type=Path, help="eval_traffic.py's raw JSON")
    parser.add_argument("trace", type=Path, help="the engine core's step trace (.csv or .csv.gz)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/step_trace_h200.json")
    args = parser.parse_args()
    raw = json.loads(args.raw.read_text())
    out = report(raw, trace_text(args.trace))
    out["inputs"] = {"raw": args.raw.name, "trace": args.trace.name}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for rule, found in out["rules"].items():
        print(rule, json.dumps(found["burst_against_run"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
