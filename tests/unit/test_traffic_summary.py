"""bench/gpu/traffic_summary.py: issue 16's goals over every users'-traffic launch."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.gpu_jobs import load_gpu_module

summary_module = load_gpu_module("traffic_summary")
Row = dict[str, Any]


def _load(
    loss: float, bound: tuple[float, float], *, blocks: int = 2, batch: float = 126.3, **extra: Any
) -> Row:
    return {
        "effective_batch": batch,
        "blocks": {"rounds_per_block": blocks},
        "best_fixed_k": "k2",
        "best_fixed_k_sign_test": {"identified": False},
        "daemon_by_k_mix": {
            "own_k": 2, "loss_from_k_mix": loss,
            "loss_lower_bound": bound[0], "loss_upper_bound": bound[1],
        },
        **extra,
    }  # fmt: skip


def _report(
    loads: dict[str, Row],
    *,
    target: str = "qwen3-4b",
    date: str = "2026-12-01T12:11",
    commit: str = "7178143c",
    settings: Row | None = None,
    code: str | None = None,
) -> Row:
    meta = {"date": date, "commit": commit, "target": target, "engine_version": "0.26.0",
            "device": "NVIDIA H200", "daemon": {"settings_from_env": settings or {}}}  # fmt: skip
    if code is not None:  # recorded from 2026-12-02 (code_fingerprint.py)
        meta["code"] = code
    return {"meta": meta, "loads": loads, "goals": {}}


def _bandit(loss: float, low: float, high: float) -> Row:
    return {"loss_from_k_mix": loss, "loss_lower_bound": low, "loss_upper_bound": high}


def _two_loads(b256: Row, b128: Row) -> dict[str, Row]:
    """One report of decode-heavy B≈254 and B≈126, tables at 0 %, with these daemon fields."""
    return {
        "a.json": _report({
            "decode-heavy-B256": _load(0.0, (0.0, 0.0), batch=254.0, **b256),
            "decode-heavy-B128": _load(0.0, (0.0, 0.0), **b128),
        }),
    }  # fmt: skip


def test_only_runs_in_blocks_of_the_target_count_and_a_trial_at_stop_is_priced_standing() -> None:
    standing = {"daemon_standing": {"loss_from_k_mix": 0.0}}
    reports = {
        "a.json": _report({
            "decode-heavy-B128": _load(0.27, (0.17, 0.39), daemon_trial_at_stop={"k": 3},
                                       tables_by_k_mix=standing),
            "decode-heavy-B96": _load(0.0, (0.0, 0.01), batch=94.7),
            "decode-heavy-B64": _load(0.5, (0.4, 0.6), blocks=1),  # no blocks: not judged so
        }),
        "moe.json": _report({"decode-heavy-B192": _load(0.4, (0.3, 0.5))}, target="qwen3-30b-a3b"),
    }  # fmt: skip
    out = summary_module.summarize(reports)
    rows = out["loads"]["decode-heavy"]
    assert [r["daemon_loss"] for r in rows] == [0.0, 0.0]
    assert rows[1]["daemon_bound"] is None and "trial" in rows[1]["note"]
    goal = out["goals"]["decode-heavy"]["daemon_worst_load_loss"]
    assert goal["verdict"] == "not judgeable"  # the standing table's price has no bound
    assert goal["not_judgeable_at"] == ["B≈126 (2026-12-01T12:11)"]
    assert out["reports"] == ["a.json"]


@pytest.mark.parametrize(
    ("losses", "verdict"),
    [
        ([(0.0, (0.0, 0.01)), (0.005, (0.0, 0.014))], "met"),
        ([(0.0, (0.0, 0.01)), (0.005, (0.0, 0.2))], "not judgeable"),
        ([(0.0, (0.0, 0.01)), (0.09, (0.0, 0.32))], "missed by point, not judgeable"),
        ([(0.0, (0.0, 0.01)), (0.09, (0.02, 0.32))], "missed"),  # its bound past it too
    ],
)
def test_the_daemon_goal_is_met_only_within_every_bound_and_missed_by_any_point_past_it(
    losses: list[tuple[float, tuple[float, float]]], verdict: str
) -> None:
    loads = {
        f"decode-heavy-B{16 * (i + 1)}": _load(*x, batch=16 * (i + 1)) for i, x in enumerate(losses)
    }
    goal = summary_module.summarize({"r.json": _report(loads)})["goals"]["decode-heavy"]
    assert goal["daemon_worst_load_loss"]["verdict"] == verdict
    assert goal["daemon_worst_load_loss"]["goal"] == "<= 1.5%"


@pytest.mark.parametrize(
    ("bandit", "verdict"),
    [
        (_bandit(0.20, 0.13, 0.25), "met"),  # its low bound past 3x the daemon's high (0.04)
        (_bandit(0.20, 0.01, 0.25), "met by point, not judgeable"),
        (_bandit(0.02, 0.0, 0.02), "missed"),  # its high bound short of 3x the daemon's low
        (_bandit(0.02, 0.0, 0.2), "missed by point, not judgeable"),
    ],
)
def test_the_bandit_goal_compares_worst_loads_and_says_when_the_bounds_decide(
    bandit: Row, verdict: str
) -> None:
    loads = {
        "long-context-B96": _load(0.01, (0.01, 0.04), nightjar_by_k_mix=bandit),
        "long-context-B16": _load(0.0, (0.0, 0.0)),
    }
    goal = summary_module.summarize({"r.json": _report(loads)})["goals"]["long-context"]
    assert goal["nightjar_style_over_daemon"]["verdict"] == verdict


def test_without_the_bandit_its_goal_is_not_run() -> None:
    out = summary_module.summarize({"r.json": _report({"chat-like-B96": _load(0.0, (0, 0.1))})})
    assert out["goals"]["chat-like"]["nightjar_style_over_daemon"]["verdict"] == "not run"


def test_a_daemon_without_bounds_is_not_judgeable_there() -> None:
    # Its own k ran as no fixed arm, mixed with other k: eval_traffic_report.py gives no bound.
    reports = {"a.json": _report({"decode-heavy-B128": _load(0.3, (None, None))})}  # type: ignore[arg-type]
    goal = summary_module.summarize(reports)["goals"]["decode-heavy"]["daemon_worst_load_loss"]
    assert goal["verdict"] == "missed by point, not judgeable"
    assert goal["not_judgeable_at"] == ["B≈126 (2026-12-01T12:11)"]


def test_the_committed_summary_is_what_the_committed_reports_give() -> None:
    committed = json.loads(summary_module.SUMMARY.read_text())
    reports = summary_module.committed_reports()
    fresh = json.loads(json.dumps(summary_module.summarize(reports), ensure_ascii=False))
    assert {k: committed[k] for k in fresh} == fresh


def test_the_newest_commits_default_daemon_is_judged_apart() -> None:
    reports = {
        "old.json": _report({"decode-heavy-B256": _load(0.16, (0.0, 0.3), batch=254.0)}),
        "new.json": _report({"decode-heavy-B256": _load(0.0, (0.0, 0.01), batch=254.0)},
                            date="2026-12-01T14:48", commit="b000b32f"),
        "trials.json": _report({"decode-heavy-B128": _load(0.02, (0.0, 0.05))},
                               date="2026-12-01T14:41", commit="b000b32f",
                               settings={"TABLETUNE_DECISION__TRIALS": "true"}),
    }  # fmt: skip
    out = summary_module.summarize(reports)
    old = out["goals"]["decode-heavy"]["daemon_worst_load_loss"]["verdict"]
    assert old == "missed by point, not judgeable"  # 16 % (0-30 %)
    newest = out["daemon_at_newest_commit"]
    assert newest["commit"] == "b000b32"
    goal = newest["goals"]["decode-heavy"]
    assert goal["verdict"] == "met" and goal["worst_at"] == "B≈254 (2026-12-01T14:48)"
    trials = [r for r in out["loads"]["decode-heavy"] if r["report"] == "trials.json"]
    assert trials[0]["daemon_settings"] == {"TABLETUNE_DECISION__TRIALS": "true"}


def test_the_newest_codes_launches_are_judged_together_whatever_their_commits() -> None:
    # The first launch's code ran before a commit of docs alone, the second after it; an
    # older code's launch stays apart.
    reports = {
        "older.json": _report({"decode-heavy-B128": _load(0.2, (0.1, 0.3))},
                              date="2026-12-02T17:00", commit="46eedb4b", code="0ld0ld0ld0ld0ld0"),
        "first.json": _report({"decode-heavy-B256": _load(0.0, (0.0, 0.01), batch=254.0)},
                              date="2026-12-02T18:00", commit="2977d26a", code="740eac4aa5309004"),
        "second.json": _report({"decode-heavy-B128": _load(0.01, (0.0, 0.012))},
                               date="2026-12-02T19:00", commit="d86ce17b", code="740eac4aa5309004"),
    }  # fmt: skip
    newest = summary_module.summarize(reports)["daemon_at_newest_commit"]
    assert (newest["commit"], newest["code"]) == ("d86ce17", "740eac4aa5309004")
    assert newest["commits"] == ["2977d26", "d86ce17"]
    goal = newest["goals"]["decode-heavy"]
    assert goal["verdict"] == "met" and goal["worst"] == 0.01  # the older code's 20 % apart


def test_the_static_tables_worst_loss_is_given_per_shape() -> None:
    priced = {"documented": {"loss_from_k_mix": 0.2, "share_at_k_not_run": 0.0},
              "measured": {"loss_from_k_mix": 0.05, "share_at_k_not_run": 0.1}}  # fmt: skip
    other = {"documented": {"loss_from_k_mix": 0.3, "share_at_k_not_run": 0.0}}
    reports = {
        "a.json": _report({"decode-heavy-B128": _load(0.0, (0.0, 0.01), tables_by_k_mix=priced),
                           "decode-heavy-B96": _load(0.0, (0.0, 0.01), batch=94.7,
                                                     tables_by_k_mix=other)}),
    }  # fmt: skip
    worst = summary_module.summarize(reports)["goals"]["decode-heavy"]["static_tables_worst"]
    assert worst["documented"] == {"worst": 0.3, "worst_at": "B≈95 (2026-12-01T12:11)",
                                   "share_at_k_not_run_there": 0.0}  # fmt: skip
    assert (
        worst["measured"]["worst"] == 0.05 and worst["measured"]["share_at_k_not_run_there"] == 0.1
    )


def test_a_report_without_what_the_summary_reads_is_named() -> None:
    broken = _report({"decode-heavy-B128": _load(0.0, (0.0, 0.01))})
    del broken["loads"]["decode-heavy-B128"]["best_fixed_k"]
    with pytest.raises(summary_module.ReportError, match=r"broken\.json.*best_fixed_k"):
        summary_module.summarize({"broken.json": broken})


def test_a_shape_change_is_judged_by_the_table_in_force_with_its_steps_reading_beside() -> None:
    """The table's reading decides, as every load's daemon arm is judged on its table; the
    reading of its steps (bursts included) stays beside it; a report before either reading
    existed keeps its tokens/s verdict."""
    target = "new table <= 60 s, >= 95 % of the gap in 90 s"
    change = {
        "measured": {"new_table_by_s": 5.9, "share_at_90s": None}, "goal": target, "pass": False,
        "by_k_mix": {"measured": {"new_table_by_s": 5.9, "share_at_90s": 0.308}, "pass": False},
        "by_table": {"measured": {"new_table_by_s": 5.9, "share_at_90s": 1.0}, "pass": True},
    }  # fmt: skip
    old = {"measured": {"new_table_by_s": 7.7, "share_at_90s": 0.73}, "goal": target,
           "pass": False}  # fmt: skip
    reports = {"a.json": _report({"decode-heavy-B128": _load(0.0, (0.0, 0.01))}),
               "b.json": _report({"decode-heavy-B128": _load(0.0, (0.0, 0.01))})}  # fmt: skip
    reports["a.json"]["goals"]["shape_change"] = change
    reports["b.json"]["goals"]["shape_change"] = old
    rows = summary_module.summarize(reports)["goals"]["shape_change"]
    assert rows[0]["pass"] is True and rows[0]["measured"]["share_at_90s"] == 1.0
    assert rows[0]["by_k_mix"] == {"share_at_90s": 0.308, "pass": False}
    assert rows[1]["pass"] is False and rows[1]["measured"]["share_at_90s"] == 0.73


def test_the_model_check_gathers_every_fixed_arm_of_the_targets_loads() -> None:
    def checked(**ratios: float) -> Row:
        load = _load(0.0, (0.0, 0.0))
        return {**load, "model_check": {a: {"counted_over_modelled": r} for a, r in ratios.items()}}

    reports = {
        "a.json": _report({"chat-like-B96": checked(k1=0.98, k3=1.02, daemon=0.5),
                           "chat-like-B16": checked(k3=0.96)}),
        "moe.json": _report({"chat-like-B96": checked(k1=0.5)}, target="qwen3-30b-a3b"),
    }  # fmt: skip
    check = summary_module.summarize(reports)["model_check"]
    assert check["fixed_arms"] == 3  # the daemon's arm and the other target's are not fixed-k
    assert check["counted_over_modelled"] == {"min": 0.96, "median": 0.98, "max": 1.02}
    assert check["median_by_k"] == {"k1": 0.98, "k3": 0.99}
    assert check["its_two_factors_median_by_k"]["step_seconds_over_wall"] == {}  # not given


def test_the_newest_commit_judges_its_bandit_and_its_shape_change_apart() -> None:
    """At the newest commit the bandit is set against that commit's daemon (an older daemon's
    miss does not cap its ratio), and only that commit's shape change is kept."""
    bandit = _bandit(0.14, 0.07, 0.2)
    target = "new table <= 60 s, >= 95 % of the gap in 90 s"
    change = {"measured": {"new_table_by_s": 4.8, "share_at_90s": 1.0}, "goal": target,
              "pass": True}  # fmt: skip
    reports = {
        "old.json": _report({"decode-heavy-B256": _load(0.16, (0.0, 0.3), batch=254.0)}),
        "new.json": _report({"decode-heavy-B256": _load(0.0, (0.0, 0.0), batch=254.0,
                                                        nightjar_by_k_mix=bandit)},
                            date="2026-12-01T23:39", commit="32f7a1ba"),
        "change.json": _report({}, date="2026-12-01T23:31", commit="32f7a1ba"),
        "old_change.json": _report({}),
    }  # fmt: skip
    reports["change.json"]["goals"]["shape_change"] = change
    reports["old_change.json"]["goals"]["shape_change"] = {**change, "pass": False}
    out = summary_module.summarize(reports)
    assert out["goals"]["decode-heavy"]["nightjar_style_over_daemon"]["verdict"].startswith(
        "missed"
    )
    newest = out["daemon_at_newest_commit"]
    assert newest["commit"] == "32f7a1b"
    assert newest["nightjar_style_over_daemon"]["decode-heavy"]["verdict"] == "met"
    assert [c["report"] for c in newest["shape_change"]] == ["change.json"]


def test_each_load_is_read_at_its_newest_launch_with_its_commit() -> None:
    """Per shape and clients, the newest launch whose daemon ran on its defaults decides the
    load's standing; its commit and date say which daemon that was."""
    reports = {
        "a.json": _report({"decode-heavy-B256": _load(0.16, (0.1, 0.3), batch=254.0),
                           "decode-heavy-B128": _load(0.05, (0.0, 0.2))}),
        "b.json": _report({"decode-heavy-B256": _load(0.0, (0.0, 0.0), batch=254.0)},
                          date="2026-12-01T23:39", commit="32f7a1ba"),
        "c.json": _report({"decode-heavy-B256": _load(0.2, (0.1, 0.3), batch=254.0)},
                          date="2026-12-02T00:00", commit="32f7a1ba",
                          settings={"TABLETUNE_DECISION__TRIALS": "true"}),
    }  # fmt: skip
    per_load = summary_module.summarize(reports)["newest_launch_per_load"]["decode-heavy"]
    assert list(per_load) == ["B128", "B256"]
    assert per_load["B256"]["verdict"] == "met"
    assert per_load["B256"]["commit"] == "32f7a1b"
    assert per_load["B256"]["at"] == "B≈254 (2026-12-01T23:39)"
    # 5 % by point against 1.5 %, its bound 0-20 %
    assert per_load["B128"]["verdict"] == "missed by point, not judgeable"


def test_the_daemon_exploring_is_judged_beside_its_table() -> None:
    """Its own windows after it settled, bursts and acceptance steps included, against the same
    goal: a lower bound past the goal misses it even where its table (exploring off) met it;
    a load whose daemon never settled long enough has no reading and is left out."""
    exploring = {"loss_from_k_mix": 0.036, "loss_lower_bound": 0.018, "loss_upper_bound": 0.048}
    unsettled = {"loss_from_k_mix": None, "note": "settled at the load for fewer than 5 windows"}
    reports = _two_loads({"daemon_exploring_by_k_mix": exploring},
                         {"daemon_exploring_by_k_mix": unsettled})  # fmt: skip
    out = summary_module.summarize(reports)
    assert out["goals"]["decode-heavy"]["daemon_worst_load_loss"]["verdict"] == "met"
    goal = out["goals"]["decode-heavy"]["daemon_exploring_worst_load_loss"]
    assert goal["verdict"] == "missed" and goal["worst"] == 0.036
    assert goal["past_the_goal"] == ["B≈254 (2026-12-01T12:11)"]
    per_load = out["newest_launch_per_load"]["decode-heavy"]
    assert per_load["B256"]["exploring"] == {"verdict": "missed", "loss": 0.036,
                                             "bound": [0.018, 0.048]}  # fmt: skip
    assert "exploring" not in per_load["B128"]
    assert out["daemon_at_newest_commit"]["exploring"]["decode-heavy"]["verdict"] == "missed"


def test_the_exploring_read_step_by_step_is_preferred_to_the_k_mix() -> None:
    """A launch that kept the engine's step trace is judged on it (every step, the switch steps
    the cells leave out too): the k mix read met, the trace misses by point (its low bound
    just under the goal: not judgeable)."""
    k_mix = {"loss_from_k_mix": 0.0062, "loss_lower_bound": 0.0009, "loss_upper_bound": 0.0133}
    traced = {"loss_against_the_table_k_steps": 0.0206, "bootstrap_95": [0.0147, 0.0267]}
    reports = _two_loads(
        {"daemon_exploring_by_k_mix": k_mix, "daemon_exploring_by_trace": traced},
        {"daemon_exploring_by_k_mix": k_mix},
    )
    out = summary_module.summarize(reports)
    per_load = out["newest_launch_per_load"]["decode-heavy"]
    missed = "missed by point, not judgeable"
    assert per_load["B256"]["exploring"] == {"verdict": missed, "loss": 0.0206,
                                             "bound": [0.0147, 0.0267]}  # fmt: skip
    assert per_load["B128"]["exploring"]["loss"] == 0.0062  # no trace: the k mix
    goal = out["goals"]["decode-heavy"]["daemon_exploring_worst_load_loss"]
    assert goal["verdict"] == missed and goal["worst"] == 0.0206


def test_an_exploring_reading_inside_a_rollbacks_hold_is_named() -> None:
    """While a rollback holds pushes the bursts run sparse: such a reading is named beside the
    exploring goal, whose verdict it still counts in."""
    held = {"loss_against_the_table_k_steps": 0.0008, "bootstrap_95": [-0.0036, 0.0051],
            "inside_a_rollback_hold_s": 58.9}  # fmt: skip
    free = {"loss_against_the_table_k_steps": 0.011, "bootstrap_95": [0.0035, 0.0188],
            "inside_a_rollback_hold_s": 0.0}  # fmt: skip
    reports = _two_loads({"daemon_exploring_by_trace": held},
                         {"daemon_exploring_by_trace": free})  # fmt: skip
    goal = summary_module.summarize(reports)["goals"]["decode-heavy"][
        "daemon_exploring_worst_load_loss"
    ]
    assert goal["read_inside_a_rollback_hold"] == ["B≈254 (2026-12-01T12:11)"]
    assert goal["worst"] == 0.011


def _with_blocks(entry: Row, ratios: list[float], scale: float) -> Row:
    """``entry`` with its arms' blocks: k2 (the daemon's k, its arm alike) against k1 at
    ``ratios``, k3 well behind, at ``scale`` tokens/s."""
    per_arm = {"k1": [scale / r for r in ratios], "k2": [scale] * len(ratios),
               "k3": [scale * 0.7] * len(ratios), "daemon": [scale] * len(ratios)}  # fmt: skip
    arms = {arm: {"tokens_per_s": [scale] * 4, "blocks": {"tokens_per_s": values}}
            for arm, values in per_arm.items()}  # fmt: skip
    return {**entry, "arms": arms, "k_time_mix": {"daemon": {"2": 1.0}}}


def test_a_load_several_newest_launches_ran_is_judged_on_their_blocks_together() -> None:
    """Launch by launch a near-tie flips which k is best (one launch reads the daemon's k 3 %
    behind); pooled, the blocks of all of them decide, and that judgement stands in for the
    launches in the pooled goal."""
    new = {"date": "2026-12-02T13:40", "commit": "6d27acf0"}
    reports = {
        "a.json": _report({"decode-heavy-B256": _with_blocks(
            _load(0.0, (0.0, 0.08), batch=254.0), [1.02, 1.01, 0.99, 1.03, 1.0], 20_000.0)},
            date="2026-12-02T13:30", commit="6d27acf0"),
        "b.json": _report({"decode-heavy-B256": _with_blocks(
            _load(0.03, (0.0, 0.09), batch=255.0), [0.96, 0.98, 0.97, 1.0, 0.99], 15_000.0)},
            **new),
        "c.json": _report({"decode-heavy-B128": _load(0.0, (0.0, 0.01))}, **new),
        "trial.json": _report({"decode-heavy-B256": _with_blocks(
            _load(0.2, (0.0, 0.3), batch=254.0, daemon_trial_at_stop={"k": 3},
                  tables_by_k_mix={"daemon_standing": {"loss_from_k_mix": 0.0}}),
            [0.5] * 5, 9_000.0)}, **new),
    }  # fmt: skip
    newest = summary_module.summarize(reports)["daemon_at_newest_commit"]
    assert newest["goals"]["decode-heavy"]["worst"] == 0.03  # b.json alone
    pooled = newest["pooled"]
    (load,) = pooled["loads"]
    assert load["reports"] == ["a.json", "b.json"]  # the trial's arm ran another table
    assert load["blocks"] == 10 and load["best_fixed_k"] == "k1"
    assert load["daemon_k"] == 2 and 0.0 < load["daemon_loss"] < 0.03
    goal = pooled["goals"]["decode-heavy"]
    assert goal["worst_at"] == "B≈254 (2 launches to 2026-12-02T13:40)"
    assert goal["worst"] == load["daemon_loss"]
    assert pooled["not_pooled"] == []


def test_a_load_whose_launches_cannot_be_pooled_says_why() -> None:
    new = {"date": "2026-12-02T13:40", "commit": "6d27acf0"}
    reports = {
        name: _report({"decode-heavy-B256": _load(0.0, (0.0, 0.08), batch=254.0)}, **new)
        for name in ("a.json", "b.json")
    }  # no blocks' tokens/s in these reports
    pooled = summary_module.summarize(reports)["daemon_at_newest_commit"]["pooled"]
    assert pooled["loads"] == [] and pooled["goals"] == {}
    why = "a.json: decode-heavy-B256: no daemon arm run in blocks"
    assert pooled["not_pooled"] == [{"load": "decode-heavy-B256", "why": why}]
