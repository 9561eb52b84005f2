"""The emulator's HTTP face, in process (FastAPI TestClient, a fake wall clock)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tabletune import metric_names as names
from tabletune.admin.auth import OPEN_ENV, OPEN_LOOPBACK, AdminAuth
from tabletune.admin.protocol import STEP_CELLS_PATH, StepCellsRead
from tabletune.plugin.metrics_core import TableTuneMetrics
from tabletune.profiler.step_reading import parse_step_reading
from tabletune.schemas import Profile, load_profile
from tabletune.sim.app import ReplicaSet, build_app
from tabletune.sim.cli import admin_auth
from tabletune.sim.metrics import render
from tabletune.sim.processes import LoadOverride
from tabletune.sim.replica import Replica, SimClock
from tabletune.sim.scenario import Scenario, parse_scenario
from tabletune.sim.serve import build_replicas, parse_ports
from tabletune.step_cells import CellTotals

REPO = Path(__file__).resolve().parents[2]
RATES = [0.8, 0.6, 0.4]
LOCAL = "http://127.0.0.1:8000"


class FakeWall:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def profile() -> Profile:
    return load_profile(REPO / "examples" / "sample-profile.json")


def scenario(**overrides: Any) -> Scenario:
    data: dict[str, Any] = {
        "name": "app",
        "engine": {
            "num_speculative_tokens": 3,
            "max_num_seqs": 256,
            "starting_table": [[1, 16, 3], [17, 32, 1], [33, 256, 0]],
        },
        "load": {"kind": "constant", "batch_size": 24},
        "acceptance": {"kind": "constant", "rates": RATES},
    }
    for key, value in overrides.items():
        data[key] = {**data[key], **value} if key == "engine" else value
    return parse_scenario(data, source="test")


class Harness:
    def __init__(self, profile: Profile, speed: float = 10.0, **overrides: Any) -> None:
        self.wall = FakeWall()
        self.slept: list[float] = []

        async def sleep(seconds: float) -> None:
            self.slept.append(seconds)

        clock = SimClock(speed=speed, start_wall=self.wall.now, wall=self.wall)
        self.scenario = scenario(**overrides)
        self.replica = Replica(self.scenario, profile, base_dir=REPO, clock=clock, sleep=sleep)
        auth = admin_auth(self.scenario, {OPEN_ENV: OPEN_LOOPBACK})
        app = build_app(ReplicaSet({8000: self.replica}), auth=auth)
        # A loopback client, as the daemon next to the emulator in the demo and the tests.
        self.client = TestClient(app, base_url=LOCAL, client=("127.0.0.1", 50000))

    def tick(self, wall_s: float) -> None:
        self.wall.now += wall_s

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        response = self.client.get("/metrics")
        assert response.status_code == 200, response.text
        out = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    def value(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted({"engine": "0", "model_name": "qwen3-4b", **labels}.items())))
        return self.samples()[key]


@pytest.fixture
def harness(profile: Profile) -> Iterator[Harness]:
    h = Harness(profile)
    yield h
    h.client.close()


def families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (type, label names without le)."""
    found = {}
    for family in text_string_to_metric_families(text):
        labels: set[str] = set()
        for sample in family.samples:
            labels |= set(sample.labels) - {"le"}
        found[family.name] = (family.type, frozenset(labels))
    return found


# The plugin's old step histograms: the emulator no longer exports them (the step cells replace
# them), and the plugin drops them too.
OLD_HISTOGRAMS = {"tabletune_decode_batch_size", "tabletune_step_duration_seconds"}


def test_metrics_match_the_plugins_families_and_vllms_names(harness: Harness) -> None:
    harness.tick(1.0)
    ours = families(harness.client.get("/metrics").text)
    registry = CollectorRegistry()
    plugin = TableTuneMetrics(registry).for_engine(model_name="qwen3-4b", engine="0")
    spec = SimpleNamespace(num_drafts=4, num_draft_tokens=12, num_draft_tokens_per_pos=[4, 4, 4])
    plugin.record_drafts(spec)
    plugin.publish_table([[1, 16, 3]], 1)
    plugin.publish_steps(
        StepCellsRead(
            cells={(3, 17, 24): CellTotals(2.0, 0.02, 0.0002, 200.0, 40.0)},
            steps_without_decode=1.0,
            started_at=1.0,
        )
    )
    theirs = families(generate_latest(registry).decode())
    plugin_names = {
        names.TT_DRAFT_TOKENS_PER_POS,
        names.TT_TABLE_VERSION,
        names.TT_TABLE_RANGE_K,
        names.TT_EXPLORATION_STEPS,
        names.TT_STEPS,
        names.TT_STEP_SECONDS,
        names.TT_STEP_SECONDS_SQUARED,
        names.TT_STEP_TOKENS,
        names.TT_STEP_REQUESTS,
        names.TT_STEPS_WITHOUT_DECODE,
    }
    assert plugin_names <= set(theirs)
    for name, shape in theirs.items():
        if name.removesuffix("_created") not in OLD_HISTOGRAMS:
            assert ours.get(name) == shape, name
    assert not {f"{n}{s}" for n in OLD_HISTOGRAMS for s in ("", "_created")} & set(ours)
    engine_labels = frozenset({"engine", "model_name"})
    assert ours[names.VLLM_NUM_DRAFTS] == ("counter", engine_labels)
    assert ours[names.VLLM_ACCEPTED_PER_POS] == ("counter", engine_labels | {"position"})
    assert ours[names.VLLM_GENERATION_TOKENS] == ("counter", engine_labels)
    assert ours[names.VLLM_NUM_REQUESTS_RUNNING] == ("gauge", engine_labels)


def test_counters_have_total_and_created(harness: Harness) -> None:
    harness.tick(2.0)
    text = harness.client.get("/metrics").text
    assert 'vllm:spec_decode_num_drafts_total{engine="0",model_name="qwen3-4b"}' in text
    assert 'vllm:spec_decode_num_drafts_created{engine="0",model_name="qwen3-4b"} 1e+06' in text
    assert harness.value("vllm:num_requests_running") == 24.0
    # B=24 is in the k=1 range: one draft token per draft.
    drafts = harness.value("vllm:spec_decode_num_drafts_total")
    assert drafts > 0
    assert harness.value("vllm:spec_decode_num_draft_tokens_total") == drafts
    assert harness.value("tabletune_spec_decode_num_draft_tokens_per_pos_total", position="1") == 0


def test_metrics_follow_the_clock_times_speed(harness: Harness) -> None:
    harness.tick(1.0)  # 10 simulated seconds
    cell = {"k": "1", "batch": "17-24"}  # B=24 runs k=1
    steps = harness.value("tabletune_steps_total", **cell)
    step_s = harness.replica.engine.step_time_s(24, 1)
    assert steps == pytest.approx(10.0 / step_s, abs=1)
    harness.tick(1.0)
    assert harness.value("tabletune_steps_total", **cell) == pytest.approx(2 * steps, abs=2)


def test_step_cells_are_the_engines_steps_with_created(harness: Harness) -> None:
    harness.tick(2.0)
    harness.replica.engine.load = LoadOverride(harness.replica.engine.load, 5, 20.0)
    harness.tick(1.0)  # 10 s at B=24 (k=1), then 10 s at B=5 (k=3)
    samples = harness.samples()
    counters = harness.replica.engine.counters
    cells = {
        (dict(labels)["k"], dict(labels)["batch"]): value
        for (name, labels), value in samples.items()
        if name == "tabletune_steps_total"
    }
    assert set(cells) == {("1", "17-24"), ("3", "5")}
    # The first step at k=3 after the load fell is counted apart, as the plugin does.
    assert harness.value("tabletune_k_switch_steps_total") == counters.switch_steps == 1
    assert sum(cells.values()) + counters.switch_steps == counters.steps
    assert harness.value("tabletune_steps_without_decode_total") == 0
    totals = counters.step_cells()[(3, 5, 5)]
    assert harness.value("tabletune_step_seconds_total", k="3", batch="5") == totals.seconds
    assert harness.value("tabletune_step_scheduled_tokens_total", k="3", batch="5") == 20 * (
        totals.steps
    )
    assert harness.value("tabletune_step_scheduled_requests_total", k="3", batch="5") == 5 * (
        totals.steps
    )
    created = harness.value("tabletune_steps_created", k="3", batch="5")
    assert created == harness.replica.created_wall


def test_put_table_changes_what_the_next_steps_draft(harness: Harness) -> None:
    harness.tick(1.0)
    before = harness.value("vllm:spec_decode_num_draft_tokens_total")
    drafts_before = harness.value("vllm:spec_decode_num_drafts_total")
    response = harness.client.put(
        "/tabletune/v1/table", json={"table": [[1, 256, 3]]}, headers={"If-Match": '"0"'}
    )
    assert response.status_code == 200, response.text
    assert response.json()["version"] == 1
    harness.tick(1.0)
    added = harness.value("vllm:spec_decode_num_draft_tokens_total") - before
    drafts = harness.value("vllm:spec_decode_num_drafts_total") - drafts_before
    assert added == 3 * drafts
    assert harness.value("tabletune_table_version") == 1
    assert harness.value("tabletune_table_range_k", range_start="1", range_end="256") == 3


def test_admin_validation_is_the_plugins(harness: Harness) -> None:
    bad = harness.client.put("/tabletune/v1/table", json={"table": [[1, 256, 2]]})
    assert bad.status_code == 422 and "not in the starting table" in bad.json()["detail"]
    stale = harness.client.put(
        "/tabletune/v1/table", json={"table": [[1, 256, 3]]}, headers={"If-Match": "7"}
    )
    assert stale.status_code == 409
    assert harness.client.get("/tabletune/v1/table").json()["version"] == 0


def test_admin_token(profile: Profile) -> None:
    h = Harness(profile, engine={"admin_token": "s3cret-0123456789abcdef"})
    assert h.client.get("/tabletune/v1/table").status_code == 401
    bearer = {"Authorization": "Bearer s3cret-0123456789abcdef"}
    assert h.client.get("/tabletune/v1/table", headers=bearer).status_code == 200


def test_the_view_reports_the_engines_tensor_parallel_size(profile: Profile) -> None:
    assert Harness(profile).client.get("/tabletune/v1/table").json()["tensor_parallel_size"] == 1
    h = Harness(profile, engine={"tensor_parallel_size": 2})
    assert h.client.get("/tabletune/v1/table").json()["tensor_parallel_size"] == 2


def test_manual_faults(harness: Harness) -> None:
    set_faults = harness.client.post("/sim/v1/faults", json={"admin_error_status": 502})
    assert set_faults.json()["admin_error_status"] == 502
    assert harness.client.get("/tabletune/v1/table").status_code == 502
    harness.client.post("/sim/v1/faults", json={"clear": True, "admin_latency_s": 1.5})
    assert harness.client.get("/tabletune/v1/table").status_code == 200
    assert harness.slept == [1.5]
    harness.client.post("/sim/v1/faults", json={"clear": True, "metrics_outage": True})
    assert harness.client.get("/metrics").status_code == 503
    harness.client.post("/sim/v1/faults", json={"clear": True, "metrics_delay_s": 0.25})
    assert harness.client.get("/metrics").status_code == 200
    assert harness.slept[-1] == 0.25
    refused = harness.client.post("/sim/v1/faults", json={"admin_error_status": 404})
    assert refused.status_code == 422


def test_scheduled_faults_follow_simulated_time(profile: Profile) -> None:
    h = Harness(
        profile,
        faults=[
            {"kind": "admin_errors", "start_s": 10, "end_s": 20},
            {"kind": "metrics_outage", "start_s": 30, "end_s": 40},
        ],
    )
    assert h.client.get("/tabletune/v1/table").status_code == 200
    h.tick(1.5)  # t = 15 s
    assert h.client.get("/tabletune/v1/table").status_code == 503
    assert h.client.get("/sim/v1/faults").json()["active"]["admin_error_status"] == 503
    assert h.client.get("/metrics").status_code == 200
    h.tick(2.0)  # t = 35 s
    assert h.client.get("/tabletune/v1/table").status_code == 200
    assert h.client.get("/metrics").status_code == 503


def test_restart_resets_counters_created_and_table(profile: Profile) -> None:
    h = Harness(profile, faults=[{"kind": "restart", "at_s": 20, "downtime_s": 5}])
    h.client.put("/tabletune/v1/table", json={"table": [[1, 256, 3]]})
    h.tick(1.5)  # t = 15 s
    before = h.value("vllm:spec_decode_num_drafts_total")
    assert h.value("tabletune_table_version") == 1
    h.tick(0.7)  # t = 22 s: down
    assert h.client.get("/metrics").status_code == 503
    assert h.client.get("/health").status_code == 503
    assert h.client.get("/tabletune/v1/table").status_code == 503
    h.tick(0.5)  # t = 27 s: back for 2 s
    assert h.client.get("/health").status_code == 200
    after = h.value("vllm:spec_decode_num_drafts_total")
    assert 0 < after < before
    assert h.value("vllm:spec_decode_num_drafts_created") == pytest.approx(1_000_000 + 2.5)
    view = h.client.get("/tabletune/v1/table").json()
    assert view["table"] == [[1, 16, 3], [17, 32, 1], [33, 256, 0]] and view["version"] == 0


def test_the_step_cells_route_answers_what_metrics_shows(profile: Profile) -> None:
    h = Harness(profile, faults=[{"kind": "restart", "at_s": 20, "downtime_s": 5}])
    for _ in range(3):
        h.tick(0.5)
        read = StepCellsRead.from_wire(h.client.get(STEP_CELLS_PATH).json())
        exported = parse_step_reading(h.client.get("/metrics").text)
        assert read.cells == exported.cells and read.cells
        assert read.steps_without_decode == exported.steps_without_decode
        assert read.switch_steps == exported.switch_steps
        assert read.started_at == h.replica.created_wall
    h.tick(0.7)  # t = 22 s: down, as every admin route
    assert h.client.get(STEP_CELLS_PATH).status_code == 503
    h.client.post("/sim/v1/faults", json={"admin_error_status": 502})
    h.tick(0.5)  # back, but the admin API fails as injected
    assert h.client.get(STEP_CELLS_PATH).status_code == 502


def test_restart_through_the_control_endpoint(harness: Harness) -> None:
    harness.tick(1.0)
    assert harness.value("vllm:spec_decode_num_drafts_total") > 0
    assert harness.client.post("/sim/v1/restart", json={}).json()["restarts"] == 1
    assert harness.value("vllm:spec_decode_num_drafts_total") == 0


def test_truth_reports_oracle_and_loss(harness: Harness) -> None:
    harness.tick(3.0)  # 30 s: three closed intervals of 10 s
    truth = harness.client.get("/sim/v1/truth").json()
    assert truth["rates"] == RATES
    assert truth["oracle_table"] == truth["profile_table"] == [[1, 256, 3]]
    assert truth["serving"] is None
    current = truth["current"]
    assert current["table_k"] == 1 and current["best_fixed_k"] == 3
    assert 0 < current["loss"] < 1
    assert len(truth["intervals"]) == 3
    assert all(0 < i["efficiency"] < 1 for i in truth["intervals"])


def test_load_and_acceptance_overrides(harness: Harness) -> None:
    harness.tick(1.0)
    harness.client.post("/sim/v1/load", json={"batch_size": 300})
    harness.client.post("/sim/v1/acceptance", json={"rates": [0.5, 0.2, 0.1]})
    harness.tick(0.1)
    assert harness.value("vllm:num_requests_running") == 256
    assert harness.value("vllm:num_requests_waiting") == 44
    assert harness.client.get("/sim/v1/truth").json()["rates"] == [0.5, 0.2, 0.1]
    bad = harness.client.post("/sim/v1/acceptance", json={"rates": [0.2, 0.5, 0.1]})
    assert bad.status_code == 422 and "non-increasing" in bad.json()["detail"]


def test_replicas_answer_on_their_own_port(profile: Profile) -> None:
    wall = FakeWall()
    ports = parse_ports(None, "9001-9003")
    replicas = build_replicas(scenario(), profile, base_dir=REPO, ports=ports, speed=1.0, wall=wall)
    app = build_app(replicas, auth=AdminAuth(open_loopback=True))
    client = TestClient(app, client=("127.0.0.1", 50000))
    client.put("http://127.0.0.1:9002/tabletune/v1/table", json={"table": [[1, 256, 0]]})
    versions = [
        client.get(f"http://127.0.0.1:{p}/tabletune/v1/table").json()["version"] for p in ports
    ]
    assert versions == [0, 1, 0]
    assert client.get("http://127.0.0.1:9009/metrics").status_code == 404
    assert client.get("http://127.0.0.1:9009/tabletune/v1/table").status_code == 503


def test_health_version_models(harness: Harness) -> None:
    assert harness.client.get("/health").status_code == 200
    assert harness.client.get("/version").json() == {"version": "0.26.0"}
    assert harness.client.get("/v1/models").json()["data"][0]["id"] == "qwen3-4b"


def test_fast_exposition_is_byte_identical_to_prometheus_client(profile: Profile) -> None:
    h = Harness(profile, engine={"model_name": 'odd"name\\with\nescapes'})
    h.tick(123.456)  # large counters and _created values in exponent form
    h.client.put("/tabletune/v1/table", json={"table": [[1, 20, 3], [21, 256, 1]]})
    h.tick(0.5)
    h.replica.sync()
    assert render(h.replica.registry) == generate_latest(h.replica.registry)


def test_truth_under_serving_traffic_is_the_models_not_the_profiles(profile: Profile) -> None:
    decode_heavy = {
        "name": "decode-heavy",
        "prompt": {"kind": "lognormal", "median": 48, "sigma": 1.0, "max": 1024},
        "output": {"kind": "lognormal", "median": 320, "sigma": 0.6, "max": 2048},
    }
    h = Harness(
        profile,
        load={"kind": "constant", "batch_size": 128},
        acceptance={"kind": "constant", "rates": [0.75, 0.55, 0.4]},
        engine={"starting_table": [[1, 64, 3], [65, 128, 2], [129, 256, 1]]},
        serving={
            "traffic": {"kind": "constant", "shape": decode_heavy},
            "attention_us_per_context_token": 0.001,
        },
    )
    h.tick(3.0)
    truth = h.client.get("/sim/v1/truth").json()
    assert truth["serving"]["shape"] == "decode-heavy"
    context = truth["serving"]["mean_context_tokens"]
    assert truth["serving"]["attention_ms_per_request"] == pytest.approx(0.001e-3 * context)
    assert truth["serving"]["next_shape_change_s"] is None
    assert truth["profile_table"] == [[1, 256, 3]]
    assert truth["oracle_table"] != truth["profile_table"]
    current = truth["current"]
    assert current["table_k"] == 2 and current["best_fixed_k"] == 2 and current["oracle_k"] == 2
    assert current["step_ms"]["3"] > 1.5 * current["profile_step_ms"]["3"]
    # Prefill rides along: the cell schedules more than its decode tokens.
    cell = {"k": "2", "batch": "121-128"}
    steps = h.value("tabletune_steps_total", **cell)
    assert h.value("tabletune_step_scheduled_tokens_total", **cell) > 128 * 3 * steps
    seconds = h.value("tabletune_step_seconds_total", **cell)
    assert seconds / steps == pytest.approx(current["step_ms"]["2"] / 1000, rel=0.05)
