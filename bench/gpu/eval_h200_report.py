"""Turn the JSON lines of `bench/gpu/eval_h200.sh` runs into bench/results/eval_h200.json + PNGs.

    .venv/bin/python bench/gpu/eval_h200_report.py bench/results/raw/eval_h200_<stamp>.jsonl [...]

Static arms: per-load loss of each arm against the best fixed k at that load (tokens/s from vLLM's
generation-token counter), the worst load per arm, and the spread between arms that ran the same
k at the same load (what one window can resolve). Repair: when the table in force first gave the
measured table's k at the load, and the steady windows' mean against the measured table measured
alone at that load. Switch: the gap between the two references (each set's measured table under
the new rates) and the share of it recovered by the window ending 30 s after the switch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tabletune.schemas import Table

FIXED = ("k0", "k1", "k2", "k3")
ARMS = (*FIXED, "docs", "measured")
LOSS_GOAL = 0.015
SWITCH_GOAL = 0.98
SWITCH_JUDGED_AT_S = 30.0
MIN_GAP = 0.005  # a gap below this is inside one window's noise: not judged
RESULTS = Path(__file__).resolve().parents[1] / "results"

Row = dict[str, Any]


def load_runs(paths: list[Path]) -> list[tuple[str, Row, list[Row]]]:
    """(run id, meta line, window lines) per file."""
    runs = []
    for path in paths:
        try:
            lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, json.JSONDecodeError) as error:
            raise SystemExit(f"{path}: not a readable eval_h200 JSON-lines file: {error}") from None
        meta = next((line for line in lines if line.get("part") == "meta"), None)
        if meta is None:
            raise SystemExit(f"{path}: no meta line: not written by bench/gpu/eval_h200.sh")
        windows = [line for line in lines if "label" in line]
        runs.append((path.stem.removeprefix("eval_h200_"), meta, windows))
    return runs


def k_at(table: list[list[int]], batch: int) -> int:
    """The k a table (vLLM's JSON form, as the plugin reports it) gives at a batch size."""
    return Table.parse(table).k_at(batch)


def static_results(windows: list[Row]) -> dict[str, dict[int, dict[str, Row]]]:
    """set -> load -> arm -> the window, with ``loss`` vs the best fixed k at that load."""
    by: dict[str, dict[int, dict[str, Row]]] = defaultdict(lambda: defaultdict(dict))
    for row in windows:
        label = row["label"]
        if label["part"] == "static":
            by[label["set"]][row["batch"]][label["arm"]] = row
    out: dict[str, dict[int, dict[str, Row]]] = {}
    for set_name, loads in by.items():
        out[set_name] = {}
        for load, arms in sorted(loads.items()):
            best = max(arms[arm]["tokens_per_s"] for arm in FIXED if arm in arms)
            out[set_name][load] = {
                arm: {
                    "tokens_per_s": round(row["tokens_per_s"], 1),
                    "loss": round(1.0 - row["tokens_per_s"] / best, 5),
                    "mean_k": round(row["mean_k"], 3),
                    "mean_running": round(row["mean_running"], 1),
                    "acceptance": row["acceptance"] and round(row["acceptance"], 4),
                }
                for arm, row in arms.items()
            }
    return out


def worst_load_loss(static: dict[int, dict[str, Row]]) -> dict[str, dict[str, float]]:
    worst: dict[str, dict[str, float]] = {}
    for load, arms in static.items():
        for arm, row in arms.items():
            if arm not in worst or row["loss"] > worst[arm]["loss"]:
                worst[arm] = {"load": load, "loss": row["loss"]}
    return worst


def same_k_spread(static: dict[int, dict[str, Row]]) -> dict[int, float | None]:
    """Per load, (max - min) / max tokens/s among arms that ran the same k: one window's noise."""
    spread: dict[int, float | None] = {}
    for load, arms in static.items():
        groups: dict[int, list[float]] = defaultdict(list)
        for row in arms.values():
            groups[round(row["mean_k"])].append(row["tokens_per_s"])
        widths = [(max(v) - min(v)) / max(v) for v in groups.values() if len(v) > 1]
        spread[load] = round(max(widths), 5) if widths else None
    return spread


def _mean(rows: list[Row]) -> float:
    return statistics.fmean(row["tokens_per_s"] for row in rows)


def repair_results(
    windows: list[Row], measured_table: list[list[int]] | None = None, steady_from_s: float = 30.0
) -> dict[int, Row]:
    """Per load: table timing, steady mean vs the measured table measured alone at that load
    (judged only where that reference was measured in the same run)."""
    runs: dict[int, list[Row]] = defaultdict(list)
    refs: dict[int, dict[str, list[Row]]] = defaultdict(lambda: defaultdict(list))
    for row in windows:
        part = row["label"]["part"]
        if part == "repair":
            runs[row["batch"]].append(row)
        elif part == "repair-reference":
            refs[row["batch"]][row["label"]["arm"]].append(row)
    out: dict[int, Row] = {}
    for load, rows in runs.items():
        measured = refs[load].get("measured")
        reference_table = measured[0]["table"] if measured else measured_table
        target_k = k_at(reference_table, load) if reference_table else None
        repaired_at = next(
            (r["window_end_s"] for r in rows if r["table"] and k_at(r["table"], load) == target_k),
            None,
        )
        steady = [r for r in rows if r["window_end_s"] - r["window_s"] >= steady_from_s - 1e-9]
        result: Row = {
            "windows": [
                {
                    "end_s": round(r["window_end_s"], 1),
                    "tokens_per_s": round(r["tokens_per_s"], 1),
                    "mean_k": round(r["mean_k"], 3),
                    "table_k": k_at(r["table"], load) if r["table"] else None,
                }
                for r in rows
            ],
            "start_table": rows[0]["label"].get("start_table"),
            "table_k_of_measured": target_k,
            "table_repaired_by_window_end_s": repaired_at and round(repaired_at, 1),
            "steady_from_s": steady_from_s,
            "steady_tokens_per_s": round(_mean(steady), 1) if steady else None,
            "references_tokens_per_s": {arm: round(_mean(v), 1) for arm, v in refs[load].items()},
        }
        if measured and steady:
            shortfall = 1.0 - _mean(steady) / _mean(measured)
            result["shortfall_vs_measured"] = round(shortfall, 5)
            result["pass"] = bool(
                shortfall <= LOSS_GOAL and repaired_at is not None and repaired_at <= 60.0
            )
        out[load] = result
    return out


def switch_results(windows: list[Row]) -> Row | None:
    run = [row for row in windows if row["label"]["part"] == "switch"]
    refs: dict[str, list[Row]] = defaultdict(list)
    for row in windows:
        if row["label"]["part"] == "switch-reference":
            refs[row["label"]["table_for"]].append(row)
    if not run:
        return None
    label = run[0]["label"]
    load, switch_at = run[0]["batch"], float(label["switch_at_s"])
    old, new = refs.get(label["from"]), refs.get(label["to"])
    result: Row = {
        "load": load,
        "from": label["from"],
        "to": label["to"],
        "switch_at_s": switch_at,
        "windows": [
            {
                "end_s": round(r["window_end_s"], 1),
                "tokens_per_s": round(r["tokens_per_s"], 1),
                "mean_k": round(r["mean_k"], 3),
                "acceptance": r["acceptance"] and round(r["acceptance"], 4),
                "table_k": k_at(r["table"], load) if r["table"] else None,
            }
            for r in run
        ],
    }
    new_k = k_at(new[0]["table"], load) if new else None
    result["table_k_for_new_rates"] = new_k
    changed = next(
        (
            r["window_end_s"]
            for r in run
            if r["window_end_s"] > switch_at and r["table"] and k_at(r["table"], load) == new_k
        ),
        None,
    )
    result["table_changed_by_s_after_switch"] = changed and round(changed - switch_at, 1)
    if not (old and new):
        return result
    old_tps, new_tps = _mean(old), _mean(new)
    gap = new_tps - old_tps
    result["references_tokens_per_s"] = {
        "old_table": round(old_tps, 1),
        "new_table": round(new_tps, 1),
    }
    result["gap"] = round(gap / new_tps, 5)
    judged = min(run, key=lambda r: abs(r["window_end_s"] - (switch_at + SWITCH_JUDGED_AT_S)))
    after = [r for r in run if switch_at + 20.0 <= r["window_end_s"] <= switch_at + 45.0 + 1e-9]
    if gap / new_tps < MIN_GAP:
        result["pass"] = None
        result["why_not_judged"] = f"gap under {MIN_GAP:.1%}: inside one window's noise"
        return result
    result["judged_window_end_s"] = round(judged["window_end_s"], 1)
    result["share_recovered"] = round((judged["tokens_per_s"] - old_tps) / gap, 3)
    if after:
        result["share_recovered_mean_20_45s"] = round((_mean(after) - old_tps) / gap, 3)
    result["pass"] = bool(result["share_recovered"] >= SWITCH_GOAL)
    return result


def report(runs: list[tuple[str, Row, list[Row]]]) -> Row:
    meta = runs[0][1]
    out: Row = {
        "benchmark": "eval_h200",
        "command": "bench/gpu/eval_h200.sh (see each run's env), then "
        "bench/gpu/eval_h200_report.py " + " ".join(f"eval_h200_{r[0]}.jsonl" for r in runs),
        "device": meta["gpu"],
        "engine": meta["engine"],
        "engine_version": meta["engine_version"],
        "date": min(r[0] for r in runs),
        "report_written": datetime.now(UTC).isoformat(timespec="seconds"),
        "profile": meta["profile"],
        "rates": {k: v for _, m, _ in runs for k, v in m["rates"].items()},
        "measured_tables": {k: v for _, m, _ in runs for k, v in m["measured_tables"].items()},
        "runs": {},
    }
    for run_id, run_meta, windows in runs:
        static = static_results(windows)
        out["runs"][run_id] = {
            "env": run_meta.get("env"),
            "static": {
                s: {
                    "per_load": loads,
                    "worst_load_loss": worst_load_loss(loads),
                    "same_k_spread": same_k_spread(loads),
                }
                for s, loads in static.items()
            },
            "repair": repair_results(windows, run_meta["measured_tables"].get("realistic")),
            "switch": switch_results(windows),
        }
    out["worst_load_loss"] = {
        f"{run_id}/{s}": body["worst_load_loss"]
        for run_id, run in out["runs"].items()
        for s, body in run["static"].items()
    }
    out["goals"] = goals(out["runs"])
    return out


def goals(runs: Row) -> Row:
    measured = {
        f"{run_id}/{s}": body["worst_load_loss"].get("measured")
        for run_id, run in runs.items()
        for s, body in run["static"].items()
    }
    repairs = {
        f"{run_id}/B={load}": {
            k: res.get(k)
            for k in ("table_repaired_by_window_end_s", "shortfall_vs_measured", "pass")
        }
        for run_id, run in runs.items()
        for load, res in run["repair"].items()
        if "pass" in res
    }
    switches = {
        run_id: {
            k: run["switch"].get(k)
            for k in ("load", "gap", "share_recovered", "share_recovered_mean_20_45s", "pass")
        }
        for run_id, run in runs.items()
        if run["switch"] and "gap" in run["switch"]
    }
    return {
        "measured_table_worst_loss_le_1.5pct": {
            "per_run_and_set": measured,
            "pass": bool(measured) and all(v and v["loss"] <= LOSS_GOAL for v in measured.values()),
        },
        "repair_within_1.5pct_of_measured_in_60s": {
            "per_run_and_load": repairs,
            "pass": bool(repairs) and all(v["pass"] for v in repairs.values()),
        },
        "switch_98pct_of_gap_in_30s": {
            "per_run": switches,
            "pass": (
                None
                if not any(v["pass"] is not None for v in switches.values())
                else all(v["pass"] is not False for v in switches.values())
            ),
        },
        "style_baselines_3x_our_worst_loss": {
            "pass": None,
            "why": "the -style baselines run on the emulator only (eval_emulator.json)",
        },
    }


def plot(result: Row, stem: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for run_id, run in result["runs"].items():
        if run["static"]:
            sets = sorted(run["static"])
            fig, axes = plt.subplots(1, len(sets), figsize=(6 * len(sets), 4), squeeze=False)
            for ax, set_name in zip(axes[0], sets, strict=True):
                per_load = run["static"][set_name]["per_load"]
                loads = sorted(per_load)
                for arm in ARMS:
                    ax.plot(loads, [100 * per_load[b][arm]["loss"] for b in loads], "o-", label=arm)
                ax.set_xscale("log", base=2)
                ax.set_xlabel("concurrency B (closed loop)")
                ax.set_ylabel("loss vs best fixed k (%)")
                ax.set_title(f"{set_name} {result['rates'][set_name]}")
                ax.axhline(100 * LOSS_GOAL, color="grey", ls=":")
                ax.legend(fontsize=7)
            fig.suptitle(f"vLLM {result['engine_version']} on {result['device']}: static tables")
            path = stem.with_name(f"{stem.name}_loss.png")
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
        timelines = [(f"repair B={b}", r) for b, r in run["repair"].items()]
        if run["switch"]:
            timelines.append((f"switch B={run['switch']['load']}", run["switch"]))
        if timelines:
            fig, axes = plt.subplots(
                1, len(timelines), figsize=(5 * len(timelines), 3.6), squeeze=False
            )
            for ax, (title, body) in zip(axes[0], timelines, strict=True):
                ends = [w["end_s"] for w in body["windows"]]
                ax.step(
                    ends, [w["tokens_per_s"] for w in body["windows"]], where="pre", label="run"
                )
                refs = body.get("references_tokens_per_s", {})
                for i, (name, value) in enumerate(refs.items()):
                    ax.axhline(value, ls="--", lw=1, label=f"{name} alone", color=f"C{i + 1}")
                if "switch_at_s" in body:
                    ax.axvline(body["switch_at_s"], color="red", lw=1, label="rates switched")
                ax.set_title(title)
                ax.set_xlabel("s since load start")
                ax.set_ylabel("tokens/s (5 s windows)")
                ax.legend(fontsize=7)
            fig.tight_layout()
            path = stem.with_name(f"{stem.name}_{run_id}_timelines.png")
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="eval_h200_<stamp>.jsonl files")
    parser.add_argument("--out", type=Path, default=RESULTS / "eval_h200.json")
    args = parser.parse_args(argv)
    result = report(load_runs(args.runs))
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for path in [args.out, *plot(result, args.out.with_suffix(""))]:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
