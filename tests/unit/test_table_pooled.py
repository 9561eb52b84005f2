"""bench/gpu/table_pooled.py: the daemon's table at one load over several launches' blocks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.gpu_jobs import load_gpu_module

pooled_module = load_gpu_module("table_pooled")
Row = dict[str, Any]
PART = "decode-heavy-B256"


def _report(
    blocks: list[dict[str, float]],
    *,
    daemon_mix: dict[str, float] | None = None,
    windows: int = 4,
    commit: str = "6d27acf",
    date: str = "2026-12-02T13:30:00+00:00",
    code: str | None = None,
    **load: Any,
) -> Row:
    """A report of one load run in blocks: per arm its tokens/s block by block."""
    arms = {
        arm: {"tokens_per_s": [1.0] * windows,
              "blocks": {"tokens_per_s": [b[arm] for b in blocks]}}
        for arm in blocks[0]
    }  # fmt: skip
    entry = {"arms": arms, "k_time_mix": {"daemon": daemon_mix or {"0": 1.0}}, **load}
    meta = {"date": date, "commit": commit, "device": "NVIDIA H200", "engine_version": "0.26.0"}
    if code is not None:  # recorded from 2026-12-02 (code_fingerprint.py)
        meta["code"] = code
    return {"meta": meta, "loads": {PART: entry}}


def _blocks(ratios: list[float], scale: float, *, k3: float = 0.8) -> list[dict[str, float]]:
    """Blocks where k1 makes ``ratio`` of k0's tokens/s, the daemon k0's, k3 well behind."""
    return [{"k0": scale, "k1": scale * r, "k3": scale * k3, "daemon": scale} for r in ratios]


def test_a_launch_faster_than_another_weighs_no_more_than_it() -> None:
    # Fast launch: k1 4 % ahead of k0 in each of 4 blocks; slow launch: k0 4 % ahead in 5.
    fast = _report(_blocks([1.04] * 4, 40_000.0))
    slow = _report(_blocks([1 / 1.04] * 5, 15_000.0))
    out = pooled_module.pool([("fast", fast), ("slow", slow)], PART, 0.015)
    # By mean tokens/s over all blocks k1 would lead (the fast launch's); block by block k0.
    assert out["best_fixed_k"] == "k0"
    assert out["blocks"] == 9
    assert [launch["blocks"] for launch in out["launches"]] == [4, 5]
    k1 = out["fixed_arms_against_the_best"]["k1"]
    assert k1["median_ratio"] == pytest.approx(1 / 1.04, abs=1e-4)
    assert out["best_fixed_k_sign_test"]["against"]["k1"]["best_ahead_in"] == 5


def test_more_blocks_narrow_the_bound_of_the_same_ratios() -> None:
    ratios = [0.97, 0.99, 1.0, 1.01, 1.02, 0.98, 1.03, 0.995]
    one = pooled_module.pool([("a", _report(_blocks(ratios, 20_000.0)))], PART, 0.015)
    three = pooled_module.pool(
        [(name, _report(_blocks(ratios, scale))) for name, scale in
         (("a", 20_000.0), ("b", 15_000.0), ("c", 18_000.0))], PART, 0.015,
    )  # fmt: skip
    upper = [r["daemon_by_k_mix"]["loss_upper_bound"] for r in (one, three)]
    assert upper[1] < upper[0]
    assert three["blocks_for_a_bound_within_the_goal"] is not None


def test_the_daemons_k_mix_is_pooled_by_its_windows() -> None:
    a = _report(_blocks([0.9] * 4, 20_000.0), daemon_mix={"0": 1.0}, windows=6)
    b = _report(_blocks([0.9] * 4, 15_000.0), daemon_mix={"0": 0.5, "1": 0.5}, windows=2)
    out = pooled_module.pool([("a", a), ("b", b)], PART, 0.015)
    assert out["daemon_k_time_mix"] == {0: 0.875, 1: 0.125}
    # k1 runs at 0.9 of k0 (the best): its eighth of the time costs 10 % of it.
    assert out["daemon_by_k_mix"]["loss_from_k_mix"] == pytest.approx(0.0125, abs=1e-4)


def test_the_goal_is_met_only_when_the_bound_is_within_it() -> None:
    clear = _blocks([0.8] * 12, 20_000.0, k3=0.7)  # k0 ahead of every other k in every block
    out = pooled_module.pool([("a", _report(clear))], PART, 0.015)
    assert out["verdict"] == "met"
    assert out["blocks_for_a_bound_within_the_goal"] == 0


@pytest.mark.parametrize(
    ("reports", "why"),
    [
        (
            [
                ("a", _report(_blocks([1.0] * 3, 1.0))),
                ("b", _report(_blocks([1.0] * 3, 1.0), commit="1cd9e3d")),
            ],
            "one code only",
        ),
        (
            [
                ("a", _report(_blocks([1.0] * 3, 1.0), code="740eac4aa5309004")),
                ("b", _report(_blocks([1.0] * 3, 1.0), code="9e1d0c77f2a1b3c4")),
            ],
            "one code only",
        ),
        ([("a", _report(_blocks([1.0] * 3, 1.0), daemon_trial_at_stop={"k": 3}))], "a trial"),
        ([("a", _report([{"k0": 1.0, "k1": 1.0}] * 3))], "no daemon arm"),
        ([("a", _report(_blocks([1.0] * 3, 1.0), daemon_mix={"2": 1.0}))], "was not run"),
        ([("a", _report([{"k0": 1.0, "daemon": 1.0}] * 3))], "not two"),
    ],
)
def test_what_cannot_be_pooled_is_refused_with_its_reason(
    reports: list[tuple[str, Row]], why: str
) -> None:
    with pytest.raises(pooled_module.NotPoolable, match=why):
        pooled_module.pool(reports, PART, 0.015)


def test_a_load_the_report_lacks_is_refused_by_name() -> None:
    with pytest.raises(pooled_module.NotPoolable, match="decode-heavy-B128: not in the report"):
        pooled_module.pool([("a", _report(_blocks([1.0] * 3, 1.0)))], "decode-heavy-B128", 0.015)


def test_no_number_of_blocks_bounds_a_point_already_past_the_goal() -> None:
    behind = _blocks([1.05] * 6, 1.0)  # k1 5 % ahead; the daemon runs k0
    blocks = [{**b, "k0": b["k0"]} for b in behind]
    assert pooled_module.blocks_for_the_goal(blocks, "k0", ["k0", "k1", "k3"], 0.015) is None


@settings(max_examples=40, deadline=None)
@given(
    ratios=st.lists(st.floats(0.85, 1.15), min_size=4, max_size=20),
    scales=st.lists(st.floats(5_000.0, 40_000.0), min_size=1, max_size=3),
)
def test_the_pooled_loss_lies_within_its_bound(ratios: list[float], scales: list[float]) -> None:
    reports = [(f"r{i}", _report(_blocks(ratios, scale))) for i, scale in enumerate(scales)]
    out = pooled_module.pool(reports, PART, 0.015)
    by_mix = out["daemon_by_k_mix"]
    assert by_mix["loss_lower_bound"] <= by_mix["loss_from_k_mix"] + 1e-9
    assert by_mix["loss_from_k_mix"] <= by_mix["loss_upper_bound"] + 1e-9
    assert out["blocks"] == len(ratios) * len(scales)


def test_the_committed_pooled_judgements_are_what_the_committed_reports_give() -> None:
    results = pooled_module.ROOT / "bench/results"
    for path in sorted(results.glob("table_pooled_*_h200.json")):
        committed = json.loads(path.read_text())
        reports = [(row["report"], json.loads((results / row["report"]).read_text()))
                   for row in committed["launches"]]  # fmt: skip
        fresh = pooled_module.pool(reports, committed["part"], 0.015)
        assert json.loads(json.dumps(fresh)) == {k: committed[k] for k in fresh}, path.name


def test_reports_that_cannot_be_read_are_refused_in_one_line_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    alien = tmp_path / "alien.json"
    alien.write_text(json.dumps({"loads": {PART: {"arms": {"daemon": {"blocks": 3}}}}}))
    cases = [
        ([str(tmp_path / "missing.json")], "cannot read a report"),
        ([str(broken)], "cannot read a report"),
        ([str(alien)], "not reports eval_traffic_report.py writes"),
    ]
    written = sorted((pooled_module.ROOT / "bench/results").glob("table_pooled_*"))
    for paths, why in cases:
        with pytest.raises(SystemExit) as stop:
            pooled_module.main([*paths, "--name", "never_written", "--part", PART])
        assert stop.value.code == 2
        assert why in capsys.readouterr().err
    assert sorted((pooled_module.ROOT / "bench/results").glob("table_pooled_*")) == written


def test_launches_of_one_code_pool_whatever_their_commits() -> None:
    # A commit between two launches that changed only docs or reports keeps their code.
    a = _report(_blocks([0.9] * 4, 20_000.0), commit="2977d26", code="740eac4aa5309004")
    b = _report(_blocks([0.9] * 5, 15_000.0), commit="d86ce17", code="740eac4aa5309004",
                date="2026-12-02T19:00:00+00:00")  # fmt: skip
    out = pooled_module.pool([("a", a), ("b", b)], PART, 0.015)
    assert (out["blocks"], out["code"], out["commit"]) == (9, "740eac4aa5309004", "d86ce17")
    assert [launch["commit"] for launch in out["launches"]] == ["2977d26", "d86ce17"]
