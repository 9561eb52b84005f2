"""bench/gpu/eval_h200_report.py: losses, repair and switch verdicts from window lines."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "eval_h200_report.py"


@pytest.fixture(scope="module")
def report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("eval_h200_report", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def window(label: dict, batch: int, tps: float, k: float, table, end_s: float = 9.0) -> dict:
    return {
        "label": label,
        "batch": batch,
        "window_s": 5.0,
        "window_end_s": end_s,
        "table": table,
        "tokens_per_s": tps,
        "mean_running": float(batch),
        "mean_k": k,
        "acceptance": 0.6 if k else None,
        "drafts": 1.0,
    }


def static(arm: str, batch: int, tps: float, k: float) -> dict:
    table = [[1, 256, int(k)]]
    return window({"part": "static", "set": "realistic", "arm": arm}, batch, tps, k, table)


def test_static_loss_is_against_the_best_fixed_k_at_each_load(report: ModuleType) -> None:
    rows = [
        static("k0", 8, 100.0, 0),
        static("k1", 8, 150.0, 1),
        static("k2", 8, 180.0, 2),
        static("k3", 8, 200.0, 3),
        static("docs", 8, 196.0, 3),
        static("measured", 8, 190.0, 2),
        static("k0", 64, 300.0, 0),
        static("k1", 64, 400.0, 1),
        static("k2", 64, 380.0, 2),
        static("k3", 64, 350.0, 3),
        static("docs", 64, 300.0, 0),
        static("measured", 64, 404.0, 1),
    ]
    per_load = report.static_results(rows)["realistic"]
    assert per_load[8]["measured"]["loss"] == pytest.approx(0.05)
    assert per_load[64]["measured"]["loss"] == pytest.approx(-0.01)
    worst = report.worst_load_loss(per_load)
    assert worst["measured"] == {"load": 8, "loss": pytest.approx(0.05)}
    assert worst["docs"] == {"load": 64, "loss": pytest.approx(0.25)}
    # same k, different arms: k3 vs docs at 8 (2 %), k2 vs measured at 8 (about 5.3 %)
    assert report.same_k_spread(per_load)[8] == pytest.approx(10 / 190, abs=1e-4)


def test_repair_is_judged_on_steady_windows_against_the_measured_reference(
    report: ModuleType,
) -> None:
    quarter = [[1, 16, 3], [17, 32, 1], [33, 128, 0]]
    measured = [[1, 76, 3], [77, 256, 1]]
    label = {"part": "repair", "start_table": quarter}
    rows = [window(label, 32, 80.0, 1, quarter, end_s=5.0 * (i + 1)) for i in range(3)]
    rows += [window(label, 32, 99.0, 3, measured, end_s=5.0 * (i + 1)) for i in range(3, 12)]
    ref = {"part": "repair-reference", "set": "realistic", "arm": "measured", "table": measured}
    rows += [window(ref, 32, 100.0, 3, measured), window(ref, 32, 100.0, 3, measured)]
    result = report.repair_results(rows)[32]
    assert result["table_repaired_by_window_end_s"] == 20.0
    assert result["shortfall_vs_measured"] == pytest.approx(0.01)
    assert result["pass"] is True
    rows[-3]["tokens_per_s"] = 50.0  # one slow steady window: the mean falls 4.5 % short
    assert report.repair_results(rows)[32]["pass"] is False


def _switch_rows(new_tps: float, after_tps: float) -> list[dict]:
    old_table, new_table = [[1, 256, 3]], [[1, 256, 1]]
    label = {"part": "switch", "switch_at_s": 45.0, "from": "realistic", "to": "collapsed"}
    rows = [window(label, 48, 100.0, 3, old_table, end_s=5.0 * (i + 1)) for i in range(12)]
    rows += [window(label, 48, after_tps, 1, new_table, end_s=5.0 * (i + 1)) for i in range(12, 19)]
    for table_for, table, tps in (
        ("realistic", old_table, 100.0),
        ("collapsed", new_table, new_tps),
    ):
        ref = {"part": "switch-reference", "set": "collapsed", "table_for": table_for}
        rows.append(window(ref, 48, tps, table[0][2], table))
    return rows


def test_switch_share_of_gap_at_30_s(report: ModuleType) -> None:
    result = report.switch_results(_switch_rows(new_tps=110.0, after_tps=109.0))
    assert result["gap"] == pytest.approx(10 / 110, abs=1e-5)
    assert result["judged_window_end_s"] == 75.0
    assert result["share_recovered"] == pytest.approx(0.9)
    assert result["pass"] is False
    assert result["table_changed_by_s_after_switch"] == 20.0


def test_a_switch_gap_inside_the_noise_is_not_judged(report: ModuleType) -> None:
    result = report.switch_results(_switch_rows(new_tps=100.3, after_tps=100.3))
    assert result["pass"] is None
    assert "noise" in result["why_not_judged"]


def test_main_writes_the_result_and_plots(report: ModuleType, tmp_path: Path) -> None:
    meta = {
        "part": "meta",
        "gpu": "NVIDIA H200",
        "engine": "vllm",
        "engine_version": "0.26.0",
        "profile": "p.json",
        "rates": {"realistic": [0.75, 0.55, 0.4], "collapsed": [0.15, 0.03, 0.01]},
        "measured_tables": {"realistic": [[1, 256, 3]]},
    }
    rows = [static(arm, 8, 100.0 + i, i % 4) for i, arm in enumerate(report.ARMS)]
    rows += _switch_rows(new_tps=110.0, after_tps=110.0)
    runs = tmp_path / "eval_h200_20261130T000000Z.jsonl"
    runs.write_text("\n".join(json.dumps(r) for r in [meta, *rows]) + "\n")
    out = tmp_path / "eval_h200.json"
    assert report.main([str(runs), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["engine_version"] == "0.26.0"
    worst = result["worst_load_loss"]["20261130T000000Z/realistic"]
    assert worst["k0"] == {"load": 8, "loss": pytest.approx(1 - 100 / 103, abs=1e-5)}
    assert result["goals"]["switch_98pct_of_gap_in_30s"]["pass"] is True
    assert (tmp_path / "eval_h200_loss.png").exists()


def test_a_file_without_the_script_s_meta_line_is_refused_by_name(
    report: ModuleType, tmp_path: Path
) -> None:
    bad = tmp_path / "eval_h200_x.jsonl"
    bad.write_text(json.dumps(static("k0", 8, 1.0, 0)) + "\n")
    out = tmp_path / "eval_h200.json"
    with pytest.raises(SystemExit, match="no meta line"):
        report.main([str(bad), "--out", str(out)])
    bad.write_text("{not json\n")
    with pytest.raises(SystemExit, match="not a readable"):
        report.main([str(bad), "--out", str(out)])
    assert not out.exists()
