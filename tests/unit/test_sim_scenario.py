"""Scenario files: the packaged ones load and fit their profile; bad ones fail naming the file
and the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tabletune.errors import InputError
from tabletune.sim.build import resolve_profile, usable_step_times
from tabletune.sim.processes import build_acceptance, build_load
from tabletune.sim.scenario import (
    ConstantTraffic,
    SweepLoad,
    SwitchTraffic,
    load_scenario,
    packaged_names,
)

REPO = Path(__file__).resolve().parents[2]
PACKAGED_DIR = REPO / "src" / "tabletune" / "sim" / "scenarios"

VALID = {
    "kind": "tabletune.sim-scenario",
    "name": "t",
    "engine": {"num_speculative_tokens": 3, "max_num_seqs": 64, "starting_table": [[1, 64, 3]]},
    "load": {"kind": "constant", "batch_size": 8},
    "acceptance": {"kind": "constant", "rates": [0.7, 0.5, 0.3]},
}


def write(tmp_path: Path, data: object, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def change_in(data: dict[str, object], path: str, value: object) -> dict[str, object]:
    """``data`` with the field at the dotted ``path`` set to ``value`` (changed in place)."""
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        node = node[part]
    node[last] = value
    return data


def with_change(path: str, value: object) -> dict[str, object]:
    return change_in(yaml.safe_load(yaml.safe_dump(VALID)), path, value)


def assert_refused(tmp_path: Path, data: dict[str, object], message: str) -> None:
    """Loading ``data`` fails with an error that starts with the file and holds ``message``."""
    path = write(tmp_path, data)
    with pytest.raises(InputError) as caught:
        load_scenario(path)
    text = str(caught.value)
    assert text.startswith(str(path)), text
    assert message in text, text


def test_the_seed_scenarios_are_packaged() -> None:
    assert {"repair", "acceptance-switch", "load-sweep", "restart", "trace"} <= set(
        packaged_names()
    )


@pytest.mark.parametrize("name", packaged_names())
def test_every_packaged_scenario_loads_and_fits_its_profile(name: str) -> None:
    scenario, base = load_scenario(name)
    usable_step_times(scenario, resolve_profile(scenario, base, None))
    build_load(scenario.load, base).at(0.0)
    build_acceptance(scenario.acceptance).at(0.0)


def test_repair_starts_from_the_quarter_documented_table() -> None:
    scenario, _ = load_scenario("repair")
    assert scenario.engine.starting_table == [[1, 16, 3], [17, 32, 1], [33, 128, 0]]
    assert scenario.engine.max_num_seqs == 256


@pytest.mark.parametrize(
    ("packaged_name", "original"),
    [
        ("sample-profile.json", "examples/sample-profile.json"),
        ("h200-inflight-profile.json", "profiles/h200-qwen3-4b-eagle3-inflight.json"),
    ],
)
def test_packaged_profiles_are_copies_of_the_repositorys(packaged_name: str, original: str) -> None:
    packaged = (PACKAGED_DIR / packaged_name).read_text(encoding="utf-8")
    assert packaged == (REPO / original).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("change", "value", "message"),
    [
        ("acceptance.rates", [0.5, 0.7, 0.3], "acceptance.constant.rates: Value error, rates must"),
        ("acceptance.rates", [0.7, 0.5], "exactly K=3"),
        ("acceptance.rates", [1.5, 0.5, 0.3], "a_1=1.5 is outside"),
        ("load.kind", "poisson", "load: Input tag 'poisson'"),
        ("load.batch_size", -1, "load.constant.batch_size: Input should be greater"),
        ("engine.starting_table", [[2, 64, 3]], "starting_table: the first range must start at 1"),
        ("engine.starting_table", [[1, 64, 4]], "exceeds the drafter's K=3"),
        ("engine.max_num_seqs", 0, "engine.max_num_seqs"),
        ("engine.colour", "red", "engine.colour: Extra inputs are not permitted"),
        ("kind", "tabletune.profile", "kind: this is a 'tabletune.profile' file"),
    ],
)
def test_invalid_scenarios_name_the_file_and_field(
    tmp_path: Path, change: str, value: object, message: str
) -> None:
    assert_refused(tmp_path, with_change(change, value), message)


def test_fault_windows_must_be_ordered(tmp_path: Path) -> None:
    data = with_change("faults", [{"kind": "metrics_outage", "start_s": 10, "end_s": 5}])
    with pytest.raises(InputError, match=r"faults\.0\.metrics_outage.*end_s \(5\.0\) must be"):
        load_scenario(write(tmp_path, data))


def test_unreadable_and_unknown_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed", encoding="utf-8")
    with pytest.raises(InputError, match="not valid YAML"):
        load_scenario(bad)
    with pytest.raises(InputError, match="not a packaged scenario"):
        load_scenario("no-such-scenario")
    with pytest.raises(InputError, match="not found"):
        load_scenario(tmp_path / "missing.yaml")


def test_json_scenarios_load_too(tmp_path: Path) -> None:
    import json

    path = tmp_path / "s.json"
    path.write_text(json.dumps(VALID), encoding="utf-8")
    scenario, base = load_scenario(path)
    assert scenario.name == "t" and base == tmp_path


def test_profile_must_cover_the_scenario(tmp_path: Path) -> None:
    scenario, base = load_scenario(write(tmp_path, with_change("engine.max_num_seqs", 512)))
    profile = resolve_profile(scenario, base, REPO / "examples" / "sample-profile.json")
    with pytest.raises(InputError, match="max_num_seqs=512 is beyond the profile"):
        usable_step_times(scenario, profile)
    scenario, base = load_scenario(write(tmp_path, VALID))
    with pytest.raises(InputError, match="names no profile"):
        resolve_profile(scenario, base, None)


def test_trace_load_from_csv_with_repeat(tmp_path: Path) -> None:
    (tmp_path / "trace.csv").write_text("time_s,batch_size\n0,4\n10,64\n20,16\n", "utf-8")
    data = with_change("load", {"kind": "trace", "file": "trace.csv", "repeat": True})
    scenario, base = load_scenario(write(tmp_path, data))
    load = build_load(scenario.load, base)
    assert [load.at(t) for t in (0, 9.9, 10, 25, 30, 41)] == [4, 4, 64, 16, 4, 64]
    assert load.next_change(12.0) == 20.0


def test_trace_errors_name_the_line(tmp_path: Path) -> None:
    (tmp_path / "trace.csv").write_text("0,4\n10,x\n", "utf-8")
    data = with_change("load", {"kind": "trace", "file": "trace.csv"})
    scenario, base = load_scenario(write(tmp_path, data))
    with pytest.raises(InputError, match=r"trace\.csv: line 2"):
        build_load(scenario.load, base)


def test_load_shapes(tmp_path: Path) -> None:
    def load_of(spec: dict[str, object]) -> object:
        scenario, base = load_scenario(write(tmp_path, with_change("load", spec)))
        return build_load(scenario.load, base)

    sweep = load_of({"kind": "sweep", "batch_sizes": [1, 256], "dwell_s": 5})
    assert [sweep.at(t) for t in (0, 4.9, 5, 10, 15)] == [1, 1, 256, 1, 256]  # type: ignore[attr-defined]
    bursts = load_of({"kind": "bursts", "base": 8, "peak": 128, "every_s": 60, "length_s": 10})
    assert [bursts.at(t) for t in (0, 9.9, 10, 60, 75)] == [128, 128, 8, 128, 8]  # type: ignore[attr-defined]
    assert bursts.next_change(12) == 60  # type: ignore[attr-defined]
    diurnal = load_of({"kind": "diurnal", "low": 10, "high": 110, "period_s": 100})
    assert [diurnal.at(t) for t in (0, 25, 50, 100)] == [10, 60, 110, 10]  # type: ignore[attr-defined]


def test_drift_moves_linearly_and_stays_valid(tmp_path: Path) -> None:
    spec = {
        "kind": "drift",
        "start_rates": [0.8, 0.6, 0.4],
        "end_rates": [0.4, 0.2, 0.0],
        "start_s": 10,
        "end_s": 50,
        "resolution_s": 1,
    }
    scenario, _ = load_scenario(write(tmp_path, with_change("acceptance", spec)))
    drift = build_acceptance(scenario.acceptance)
    assert drift.at(0) == (0.8, 0.6, 0.4) and drift.at(60) == (0.4, 0.2, 0.0)
    assert drift.at(30) == pytest.approx((0.6, 0.4, 0.2))
    assert drift.next_change(30.5) == 31.0 and drift.next_change(0) == 10


@pytest.mark.parametrize("name", packaged_names())
def test_every_packaged_scenario_runs_for_a_while(name: str) -> None:
    from tabletune.sim.build import build_engine, start_engine_side

    scenario, base = load_scenario(name)
    engine = build_engine(scenario, resolve_profile(scenario, base, None), base_dir=base)
    start_engine_side(scenario, engine)
    engine.advance(700.0)
    c = engine.counters
    assert c.steps > 0 and engine.now >= 700.0
    assert c.num_draft_tokens == int(c.draft_tokens_per_pos.sum())
    assert all(c.accepted_per_pos <= c.draft_tokens_per_pos)
    assert len(engine.history) >= 69


SERVING = {
    "traffic": {
        "kind": "constant",
        "shape": {
            "name": "chat",
            "prompt": {"kind": "lognormal", "median": 48, "sigma": 1.0, "max": 1024},
            "output": {"kind": "uniform", "low": 100, "high": 500},
        },
    }
}


@pytest.mark.parametrize(
    ("change", "value", "message"),
    [
        (
            "serving.traffic.shape.prompt.sigma",
            0,
            "serving.traffic.constant.shape.prompt.lognormal.sigma: Input should be greater than 0",
        ),
        (
            "serving.traffic.shape.prompt.median",
            2000,
            "prompt.lognormal: Value error, median (2000.0) must be <= max (1024)",
        ),
        (
            "serving.traffic.shape.output.low",
            600,
            "output.uniform: Value error, high (500) must be >= low (600)",
        ),
        ("serving.traffic.shape.output.kind", "zipf", "output: Input tag 'zipf' found"),
        ("serving.traffic.kind", "poisson", "serving.traffic: Input tag 'poisson'"),
        ("serving.graph_miss_factor", 0.5, "serving.graph_miss_factor: Input should be greater"),
        (
            "serving.graph_limit_tokens",
            1024,
            "graph_limit_tokens (1024) must be <= max_num_batched_tokens (1000)",
        ),
        ("serving.max_num_batched_tokens", 256, "max_num_batched_tokens (256) leaves no room"),
        (
            "serving.traffic.shape.output",
            {"kind": "constant", "tokens": 2},
            "serving: Value error, traffic: shape 'chat' needs 1",
        ),
        ("serving.colour", "red", "serving.colour: Extra inputs are not permitted"),
    ],
)
def test_invalid_serving_sections_name_the_file_and_field(
    tmp_path: Path, change: str, value: object, message: str
) -> None:
    data = with_change("serving", copy.deepcopy(SERVING))
    if change == "serving.graph_limit_tokens":
        change_in(data, "serving.max_num_batched_tokens", 1000)
    if change == "serving.max_num_batched_tokens":  # 64 x (1 + 3) decode tokens fill 256
        change_in(data, "serving.graph_limit_tokens", 128)
    assert_refused(tmp_path, change_in(data, change, value), message)


def test_a_valid_serving_section_loads_with_the_documented_defaults(tmp_path: Path) -> None:
    scenario, _ = load_scenario(write(tmp_path, with_change("serving", SERVING)))
    assert scenario.serving is not None
    model = scenario.serving.model()
    assert (model.graph_limit_tokens, model.graph_miss_factor) == (512, 1.8)
    assert model.prefill_s_per_token == pytest.approx(8e-6)
    assert (model.context_cost, model.max_num_batched_tokens) == (0.0, 8192)
    assert not model.graph_misses_in_profile
    shape = scenario.serving.traffic.shape.shape()  # type: ignore[union-attr]
    assert shape.output.mean == pytest.approx(300.0)
    assert (
        shape
        is load_scenario(write(tmp_path, with_change("serving", SERVING), "t.yaml"))[
            0
        ].serving.traffic.shape.shape()
    )  # type: ignore[union-attr]  # shared by replicas


def test_packaged_serving_scenarios() -> None:
    scenario, _ = load_scenario("serving-decode-heavy")
    assert scenario.serving is not None and scenario.serving.context_cost == 0.3
    assert isinstance(scenario.load, SweepLoad)
    assert (min(scenario.load.batch_sizes), max(scenario.load.batch_sizes)) == (16, 256)
    change, _ = load_scenario("shape-change")
    assert change.serving is not None and isinstance(change.serving.traffic, SwitchTraffic)
    shapes = (change.serving.traffic.before.name, change.serving.traffic.after.name)
    assert shapes == ("decode-heavy", "prefill-heavy")


def test_long_context_charges_attention_alike_at_every_k_and_its_prefill_keeps_up() -> None:
    from tabletune.sim.build import build_engine

    scenario, base = load_scenario("serving-long-context")
    spec = scenario.serving
    assert spec is not None and isinstance(spec.traffic, ConstantTraffic)
    traffic = spec.traffic.shape.shape()
    assert (traffic.prompt.mean, traffic.output.mean) == pytest.approx((3000.0, 200.0))
    assert spec.max_num_batched_tokens == 8192  # vLLM 0.26's API server on an H200
    model = spec.model()
    # Prompts of 3,000 tokens for outputs of 200: the closed loop holds up to max_num_seqs only.
    assert model.worst_prefill_share(scenario.engine.max_num_seqs, 3, traffic) < 1.0
    profile = resolve_profile(scenario, base, None)
    free = spec.model_copy(update={"attention_us_per_context_token": 0.0})
    engines = [
        build_engine(scenario.model_copy(update={"serving": s}), profile, base_dir=base)
        for s in (spec, free)
    ]
    attention = model.attention_seconds(96.0, traffic)
    assert attention > 0.005
    for k in range(4):
        charged, plain = (e.true_step_s(96, k) for e in engines)
        assert charged - plain == pytest.approx(attention, rel=1e-9)
