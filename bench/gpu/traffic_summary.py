"""Every users'-traffic launch in one place: issue 16's goals over all of them (+ PNG).

Reads the committed reports (bench/results/eval_traffic_*_h200.json, eval_traffic_report.py's)
of one target that ran in interleaved blocks, and per shape and load lists what each launch
measured: the best fixed k, the daemon's loss by the k its steps ran with its bound, the
Nightjar-style bandit's the same way. A daemon part that ended inside a trial is priced by the
table the trial replaced (``daemon_standing``; the arm ran the trial's table), with no bound.
Per shape, judged on every load of every launch:
- the daemon's worst-load loss against the goal (<= 1.5 % decode-heavy, <= 3 % else): "met"
  when every bound is within it, "missed" when some loss by point is past it, else "not
  judgeable"; judged on its table (its arm, exploring off) and, beside it, on its own windows
  once settled until its part ended, exploring on (``daemon_exploring_worst_load_loss``: what
  the bursts measuring each k after a start cost; the parts last 30 s, so not what it costs
  after longer): by the engine's step trace where the launch kept one (``exploring_reading``
  "step trace": every step, the switch steps the cells leave out too, bound by a bootstrap
  over windows), else by the k mix of its cells, which reads low without those steps;
- each static table's worst loss by k mix (vLLM's documented one, the measured one, the
  pure-decode profile's), for comparison;
- the Nightjar-style bandit's worst-load loss against 3x the daemon's worst: by point, and
  judgeable when the bandit's worst low bound is past 3x the daemon's worst high bound (or
  short of 3x its worst point, for a miss);
and the shape change as each launch that ran one measured it; and how well the daemon's model
(B·τ(k)/T from the steps' own times) gave the tokens vLLM counted for every fixed arm
(``model_check``). The daemon's goal is also given
over the launches of the newest code whose daemon ran on its default settings
(``daemon_at_newest_commit``: the newest launch's code, code_fingerprint.py's hash of the
daemon, profiles and driver where the launch recorded it, else its commit; every commit that
ran it; the bandit against that daemon and that code's shape change beside): older launches
ran a daemon since changed; and per load, the daemon's goal at that
load's newest launch with the commit it ran (``newest_launch_per_load``).

    .venv/bin/python bench/gpu/traffic_summary.py   # bench/results/eval_traffic_summary_h200.*
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from code_fingerprint import code_of
from table_pooled import NotPoolable, pool

ROOT = Path(__file__).resolve().parents[2]

Row = dict[str, Any]
TARGET = "qwen3-4b"
GOALS = {"decode-heavy": 0.015}  # the daemon's worst-load loss; every other shape: DEFAULT_GOAL
DEFAULT_GOAL = 0.03
NIGHTJAR_FACTOR = 3.0
FIXED_ARMS = ("k0", "k1", "k2", "k3")


def shape_of(load: str) -> str:
    """``decode-heavy-B256`` -> ``decode-heavy``."""
    return load.rsplit("-B", 1)[0]


def rows_of(report: Row, name: str) -> list[Row]:
    """One row per load of a report run in blocks whose daemon is priced by its k mix."""
    meta, out = report["meta"], []
    for load, entry in (report.get("loads") or {}).items():
        in_blocks = (entry or {}).get("blocks", {}).get("rounds_per_block", 1) > 1
        if not in_blocks or not entry.get("daemon_by_k_mix"):
            continue
        daemon = entry["daemon_by_k_mix"]
        row: Row = {
            "shape": shape_of(load),
            "clients": load.rsplit("-B", 1)[1],
            "effective_batch": entry["effective_batch"],
            "report": name,
            "date": meta["date"],
            "commit": meta["commit"][:7],
            "code": code_of(meta),
            "best_fixed_k": entry["best_fixed_k"],
            "best_identified": entry["best_fixed_k_sign_test"]["identified"],
            "daemon_k": daemon["own_k"],
            "daemon_loss": daemon["loss_from_k_mix"],
            "daemon_bound": bound_of(daemon),
        }
        row["tables"] = {
            table: {"loss": priced["loss_from_k_mix"],
                    "share_at_k_not_run": priced["share_at_k_not_run"]}
            for table, priced in (entry.get("tables_by_k_mix") or {}).items()
            if table != "daemon_standing"
        }  # fmt: skip
        changed = (meta.get("daemon") or {}).get("settings_from_env") or {}
        if changed:  # the daemon ran with settings other than its defaults
            row["daemon_settings"] = changed
        if entry.get("daemon_trial_at_stop"):  # the arm ran a trial's table: the standing one
            row["daemon_loss"] = entry["tables_by_k_mix"]["daemon_standing"]["loss_from_k_mix"]
            row["daemon_bound"] = None
            row["note"] = "ended inside a trial: priced by the table it replaced"
        exploring = entry.get("daemon_exploring_by_k_mix") or {}
        traced = entry.get("daemon_exploring_by_trace") or {}
        read: Row = {}
        if traced.get("bootstrap_95"):  # step by step, the switch steps the cells omit too
            read = traced
            row["exploring_loss"] = traced["loss_against_the_table_k_steps"]
            row["exploring_bound"] = traced["bootstrap_95"]
            row["exploring_reading"] = "step trace"
        elif exploring.get("loss_from_k_mix") is not None:  # its own windows once settled
            read = exploring
            row["exploring_loss"] = exploring["loss_from_k_mix"]
            row["exploring_bound"] = [exploring["loss_lower_bound"], exploring["loss_upper_bound"]]
            row["exploring_reading"] = "k mix (reads low: switch steps are in no cell)"
        if read.get("inside_a_rollback_hold_s"):  # bursts sparse then: not the usual price
            row["exploring_inside_a_rollback_hold_s"] = read["inside_a_rollback_hold_s"]
        bandit = entry.get("nightjar_by_k_mix")
        if bandit:
            row["nightjar_loss"] = bandit["loss_from_k_mix"]
            row["nightjar_bound"] = [bandit["loss_lower_bound"], bandit["loss_upper_bound"]]
        out.append(row)
    return out


def bound_of(priced: Row) -> list[float] | None:
    """A loss's bounds, or None where there are none (its own k run as no fixed arm, in a mix
    with other k, which eval_traffic_report.py does not bound)."""
    low, high = priced["loss_lower_bound"], priced["loss_upper_bound"]
    return None if low is None or high is None else [low, high]


class ReportError(ValueError):
    """A report lacks what the summary reads (not one eval_traffic_report.py wrote)."""


def read_rows(report: Row, name: str) -> list[Row]:
    """``rows_of``, with a report that lacks a field it reads named in one line."""
    try:
        return rows_of(report, name)
    except (KeyError, TypeError) as error:
        raise ReportError(
            f"{name}: not a report eval_traffic_report.py writes ({error!r})"
        ) from None


def daemon_goal(rows: list[Row], limit: float, reading: str = "daemon") -> Row:
    """``reading``: ``daemon`` (its table, run as an arm with exploring off) or ``exploring``
    (its own windows once settled, bursts included). Missed when a load's point is past the
    goal; sure only where that load's bound is past it too (else "missed by point, not
    judgeable", as the bandit's verdict)."""
    loss, bound = f"{reading}_loss", f"{reading}_bound"
    worst = max(rows, key=lambda r: r[loss])
    bounded = [r for r in rows if r[bound] is not None]
    if worst[loss] > limit:
        sure = any(r[bound] is not None and r[bound][0] > limit for r in rows)
        verdict = "missed" if sure else "missed by point, not judgeable"
    elif len(bounded) == len(rows) and all(r[bound][1] <= limit for r in rows):
        verdict = "met"
    else:
        verdict = "not judgeable"
    return {
        "goal": f"<= {limit:.1%}",
        "worst": worst[loss],
        "worst_at": _where(worst),
        "verdict": verdict,
        "past_the_goal": [_where(r) for r in rows if r[loss] > limit],
        "not_judgeable_at": [_where(r) for r in rows if r[bound] is None or r[bound][1] > limit],
    }


def exploring_goal(rows: list[Row], limit: float) -> Row | None:
    """The daemon's goal read from its own windows once settled (None: no load has them),
    naming the loads whose reading fell inside a rollback's hold on pushes, where the bursts
    ran sparse (``read_inside_a_rollback_hold``)."""
    read = [r for r in rows if "exploring_loss" in r]
    if not read:
        return None
    goal = daemon_goal(read, limit, "exploring")
    held = [_where(r) for r in read if r.get("exploring_inside_a_rollback_hold_s")]
    if held:  # a rollback's hold runs the bursts sparse: those readings price less exploring
        goal["read_inside_a_rollback_hold"] = held
    return goal


def tables_worst(rows: list[Row]) -> Row:
    """Per static table (vLLM's documented one, the measured ones), its worst loss by k mix
    over the shape's loads and where; steps at a k no arm ran are not priced (their share is
    given), so a worst here is a lower bound where that share is not 0."""
    out: Row = {}
    for name in sorted({t for r in rows for t in r.get("tables", {})}):
        priced = [r for r in rows if name in r.get("tables", {})]
        worst = max(priced, key=lambda r: r["tables"][name]["loss"])
        out[name] = {
            "worst": worst["tables"][name]["loss"],
            "worst_at": _where(worst),
            "share_at_k_not_run_there": worst["tables"][name]["share_at_k_not_run"],
        }
    return out


def nightjar_goal(rows: list[Row]) -> Row:
    ran = [r for r in rows if "nightjar_loss" in r]
    if not ran:
        return {"goal": f">= {NIGHTJAR_FACTOR:g}x the daemon's", "verdict": "not run"}
    daemon = max(r["daemon_loss"] for r in rows)
    bounds = [r["daemon_bound"] or (0.0, 1.0) for r in rows]  # no bound: anything
    bandit = max(ran, key=lambda r: r["nightjar_loss"])
    ratio = bandit["nightjar_loss"] / daemon if daemon > 0 else None
    met = ratio is None or ratio >= NIGHTJAR_FACTOR
    if met:  # sure when even its lowest worst is past 3x the daemon's highest worst
        sure = max(r["nightjar_bound"][0] for r in ran) >= NIGHTJAR_FACTOR * max(
            high for _, high in bounds
        )
    else:  # sure when even its highest worst is short of 3x the daemon's lowest worst
        sure = max(r["nightjar_bound"][1] for r in ran) < NIGHTJAR_FACTOR * max(
            low for low, _ in bounds
        )
    return {
        "goal": f">= {NIGHTJAR_FACTOR:g}x the daemon's",
        "nightjar_worst": bandit["nightjar_loss"],
        "nightjar_worst_at": _where(bandit),
        "daemon_worst": daemon,
        "ratio": ratio,
        "verdict": ("met" if met else "missed") + ("" if sure else " by point, not judgeable"),
    }


def shape_changes(reports: dict[str, Row]) -> list[Row]:
    """Each launch's shape change, judged by the daemon's table in force (as every load's
    daemon arm is judged, exploring off), the reading of its steps (bursts included) beside."""
    out = []
    for name, report in sorted(reports.items()):
        change = (report.get("goals") or {}).get("shape_change") or {}
        if change.get("measured") is None:
            continue
        judged = change.get("by_table") or change.get("by_k_mix") or change
        steps = change.get("by_k_mix")
        beside = {}
        if steps is not None:
            beside["by_k_mix"] = {"share_at_90s": steps["measured"]["share_at_90s"],
                                  "pass": steps["pass"]}  # fmt: skip
        out.append({
            "report": name, "date": report["meta"]["date"],
            "commit": report["meta"]["commit"][:7], "code": code_of(report["meta"]),
            "goal": change["goal"],
            "measured": judged["measured"], "pass": judged["pass"], **beside,
        })  # fmt: skip
    return out


def model_check(reports: dict[str, Row]) -> Row:
    """Every fixed k arm of every load: vLLM's counted tokens over what the daemon's model
    gives for the same steps (eval_traffic_report's per-load ``model_check``)."""
    checks: dict[str, list[Row]] = defaultdict(list)
    for report in reports.values():
        for load in (report.get("loads") or {}).values():
            for arm, check in ((load or {}).get("model_check") or {}).items():
                if arm in FIXED_ARMS:
                    checks[arm].append(check)
    ratios = sorted(c["counted_over_modelled"] for arm in checks.values() for c in arm)
    if not ratios:
        return {}

    def median_by_k(field: str) -> Row:
        return {arm: round(statistics.median(c[field] for c in mine if field in c), 4)
                for arm, mine in sorted(checks.items())
                if any(field in c for c in mine)}  # fmt: skip

    return {
        "fixed_arms": len(ratios),
        "counted_over_modelled": {"min": ratios[0], "median": statistics.median(ratios),
                                  "max": ratios[-1]},
        "median_by_k": median_by_k("counted_over_modelled"),
        "its_two_factors_median_by_k": {
            "tokens_counted_over_modelled": median_by_k("tokens_counted_over_modelled"),
            "step_seconds_over_wall": median_by_k("step_seconds_over_wall"),
        },
    }  # fmt: skip


def summarize(reports: dict[str, Row]) -> Row:
    """``reports``: file name -> report. Rows of the target's runs in blocks, goals per shape."""
    chosen = {n: r for n, r in reports.items() if r["meta"].get("target") == TARGET}
    rows = [row for name, rep in sorted(chosen.items()) for row in read_rows(rep, name)]
    by_shape: dict[str, list[Row]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: (r["shape"], r["effective_batch"], r["date"])):
        by_shape[row["shape"]].append(row)
    changes = shape_changes(chosen)
    return {
        "target": TARGET,
        "reports": sorted({r["report"] for r in rows}),
        "dates": [min(r["date"] for r in rows), max(r["date"] for r in rows)] if rows else [],
        "engine_versions": sorted({chosen[r["report"]]["meta"]["engine_version"] for r in rows}),
        "devices": sorted({chosen[r["report"]]["meta"]["device"] for r in rows}),
        "goals": {
            shape: {
                "daemon_worst_load_loss": daemon_goal(group, GOALS.get(shape, DEFAULT_GOAL)),
                "daemon_exploring_worst_load_loss": exploring_goal(
                    group, GOALS.get(shape, DEFAULT_GOAL)
                ),
                "nightjar_style_over_daemon": nightjar_goal(group),
                "static_tables_worst": tables_worst(group),
            }
            for shape, group in by_shape.items()
        }
        | {"shape_change": changes},
        "daemon_at_newest_commit": newest_commit_goals(rows, changes, chosen),
        "newest_launch_per_load": newest_launch_per_load(rows),
        "model_check": model_check(chosen),
        "loads": dict(by_shape),
    }


def newest_commit_goals(rows: list[Row], changes: list[Row], reports: dict[str, Row]) -> Row:
    """The goals over the newest code's launches (``code_of``: the newest launch's, by date,
    whatever commits ran it) whose daemon ran on its default settings: the daemon's and the
    bandit's against it per shape, and its shape changes; and the daemon's again with each
    load that several of them ran judged on their blocks together (``pooled``,
    table_pooled.py), in place of each launch alone."""
    if not rows:
        return {}
    newest = max(rows, key=lambda r: r["date"])
    commit, code = newest["commit"], newest["code"]
    mine = [r for r in rows if r["code"] == code and not r.get("daemon_settings")]
    by_shape = {s: [r for r in mine if r["shape"] == s] for s in sorted({r["shape"] for r in mine})}
    pooled, not_pooled = pooled_rows(mine, reports)
    return {
        "commit": commit,
        "code": code,
        "commits": sorted({r["commit"] for r in mine}),
        "goals": {
            shape: daemon_goal(group, GOALS.get(shape, DEFAULT_GOAL))
            for shape, group in by_shape.items()
        },
        "pooled": {
            "loads": pooled,
            "not_pooled": not_pooled,
            "goals": {
                shape: daemon_goal(with_pooled(group, pooled), GOALS.get(shape, DEFAULT_GOAL))
                for shape, group in by_shape.items()
                if any(r["shape"] == shape for r in pooled)
            },
        },
        "nightjar_style_over_daemon": {
            shape: nightjar_goal(group)
            for shape, group in by_shape.items()
            if any("nightjar_loss" in r for r in group)
        },
        "exploring": {
            shape: goal
            for shape, group in by_shape.items()
            if (goal := exploring_goal(group, GOALS.get(shape, DEFAULT_GOAL))) is not None
        },
        "shape_change": [c for c in changes if c["code"] == code],
    }


def pooled_rows(rows: list[Row], reports: dict[str, Row]) -> tuple[list[Row], list[Row]]:
    """One row per load that more than one of ``rows`` (launches of one code) ran with its
    daemon's table in the arm (not a trial's), judged on their blocks together; and the loads
    that could not be pooled, with why."""
    by_load: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in rows:
        if row["daemon_bound"] is not None:
            by_load[(row["shape"], row["clients"])].append(row)
    pooled, refused = [], []
    for (shape, clients), group in sorted(by_load.items()):
        if len(group) < 2:
            continue
        names = [r["report"] for r in group]
        try:
            judged = pool([(n, reports[n]) for n in names], f"{shape}-B{clients}",
                          GOALS.get(shape, DEFAULT_GOAL))  # fmt: skip
        except NotPoolable as why:
            refused.append({"load": f"{shape}-B{clients}", "why": str(why)})
            continue
        by_mix = judged["daemon_by_k_mix"]
        pooled.append({
            "shape": shape, "clients": clients,
            "effective_batch": statistics.fmean(r["effective_batch"] for r in group),
            "reports": names, "date": max(r["date"] for r in group), "commit": group[0]["commit"],
            "blocks": judged["blocks"], "best_fixed_k": judged["best_fixed_k"],
            "best_identified": judged["best_fixed_k_sign_test"]["identified"],
            "daemon_k": by_mix["own_k"], "daemon_loss": by_mix["loss_from_k_mix"],
            "daemon_bound": [by_mix["loss_lower_bound"], by_mix["loss_upper_bound"]],
            "blocks_for_a_bound_within_the_goal": judged["blocks_for_a_bound_within_the_goal"],
        })  # fmt: skip
    return pooled, refused


def with_pooled(rows: list[Row], pooled: list[Row]) -> list[Row]:
    """``rows`` with the launches of each pooled load replaced by its pooled row."""
    loads = {(p["shape"], p["clients"]) for p in pooled}
    kept = [r for r in rows if (r["shape"], r["clients"]) not in loads]
    shapes = {r["shape"] for r in rows}
    return kept + [p for p in pooled if p["shape"] in shapes]


def newest_launch_per_load(rows: list[Row]) -> Row:
    """Per shape and clients, the daemon's goal at the newest launch of that load whose daemon
    ran on its default settings, with the commit it ran: where each load stands now."""
    out: dict[str, Row] = defaultdict(dict)
    for (shape, clients), row in newest_rows(rows).items():
        limit = GOALS.get(shape, DEFAULT_GOAL)
        goal = daemon_goal([row], limit)
        out[shape][f"B{clients}"] = {
            "verdict": goal["verdict"], "loss": row["daemon_loss"], "bound": row["daemon_bound"],
            "at": goal["worst_at"], "commit": row["commit"],
        }  # fmt: skip
        if "exploring_loss" in row:
            out[shape][f"B{clients}"]["exploring"] = {
                "verdict": daemon_goal([row], limit, "exploring")["verdict"],
                "loss": row["exploring_loss"], "bound": row["exploring_bound"],
            }  # fmt: skip
    return dict(out)


def newest_rows(rows: list[Row]) -> dict[tuple[str, str], Row]:
    """(shape, clients) -> the newest row of that load whose daemon ran on its defaults."""
    defaults = [r for r in rows if not r.get("daemon_settings")]
    ordered = sorted(defaults, key=lambda r: (r["shape"], int(r["clients"]), r["date"]))
    return {(r["shape"], r["clients"]): r for r in ordered}  # the newest is written last


def _where(row: Row) -> str:
    if "reports" in row:  # several launches pooled
        launches = len(row["reports"])
        return f"B≈{row['effective_batch']:.0f} ({launches} launches to {row['date'][:16]})"
    return f"B≈{row['effective_batch']:.0f} ({row['date'][:16]})"


def plot(summary: Row, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(summary["loads"])
    newest = {
        id(r) for r in newest_rows([r for rows in summary["loads"].values() for r in rows]).values()
    }
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        for who, colour in (("daemon", "C0"), ("nightjar", "C3")):
            rows = [r for r in summary["loads"][shape] if f"{who}_loss" in r]
            for r in rows:
                low, high = r.get(f"{who}_bound") or (r[f"{who}_loss"],) * 2
                ax.errorbar(
                    r["effective_batch"], 100 * r[f"{who}_loss"], fmt="o", color=colour,
                    yerr=[[100 * (r[f"{who}_loss"] - low)], [100 * (high - r[f"{who}_loss"])]],
                    alpha=0.9 if id(r) in newest else 0.25,  # a load's newest launch stands out
                    label=who if r is rows[0] else None,
                )  # fmt: skip
        ax.axhline(100 * GOALS.get(shape, DEFAULT_GOAL), color="k", ls="--", lw=1, label="goal")
        ax.set(title=shape, xlabel="effective batch", ylabel="loss vs best fixed k (%)")
        ax.legend(fontsize=8)
    fig.suptitle(
        "Users' traffic on the H200: loss by the k the steps ran, with bounds "
        "(faded: a load's older launches)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


SUMMARY = ROOT / "bench/results/eval_traffic_summary_h200.json"


def committed_reports(results: Path = ROOT / "bench/results") -> dict[str, Row]:
    """File name -> report, every users'-traffic report in ``results`` (not this summary)."""
    return {
        p.name: json.loads(p.read_text())
        for p in sorted(results.glob("eval_traffic_*_h200.json"))
        if p.name != SUMMARY.name
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SUMMARY)
    args = parser.parse_args(argv)
    try:
        summary = summarize(committed_reports())
    except ReportError as error:
        parser.error(str(error))
    made = {
        "what": __doc__.splitlines()[0],
        "command": "bench/gpu/traffic_summary.py",
    }
    args.out.write_text(json.dumps(made | summary, indent=1, ensure_ascii=False) + "\n")
    plot(summary, args.out.with_suffix(".png"))
    print(json.dumps(summary["goals"], indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
