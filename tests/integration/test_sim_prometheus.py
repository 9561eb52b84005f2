"""A real Prometheus scrapes the emulator: rate()/increase() give the scenario's acceptance,
each engine is its own target, a restart shows as a counter reset, an outage as up == 0."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from tabletune.schemas import load_profile
from tabletune.schemas.profile import step_times_of
from tabletune.solver import tau
from tests.integration.conftest import PrometheusFactory
from tests.support.servers import sim_server

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RATES = (0.8, 0.6, 0.4)
BATCH = 32
SPEED = 20.0

PER_POSITION = (
    "sum by (instance, position) (increase(vllm:spec_decode_num_accepted_tokens_per_pos_total[1m]))"
    " / ignoring(position) group_left"
    " sum by (instance) (increase(vllm:spec_decode_num_drafts_total[1m]))"
)


def write_scenario(tmp_path: Path) -> Path:
    scenario = {
        "kind": "tabletune.sim-scenario",
        "name": "prometheus-check",
        "profile": str(REPO / "examples" / "sample-profile.json"),
        "engine": {
            "num_speculative_tokens": 3,
            "max_num_seqs": 256,
            "starting_table": [[1, 256, 3]],
        },
        "load": {"kind": "constant", "batch_size": BATCH},
        "acceptance": {"kind": "constant", "rates": list(RATES)},
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario), encoding="utf-8")
    return path


def test_prometheus_sees_the_scenarios_acceptance_and_restarts(
    tmp_path: Path, prometheus_factory: PrometheusFactory
) -> None:
    with sim_server(tmp_path, write_scenario(tmp_path), replicas=3, speed=SPEED) as sim:
        prom = prometheus_factory(sim.targets)
        prom.wait_for_targets_up(count=3)
        prom.wait_for_samples("vllm:spec_decode_num_drafts_total", minimum=4)

        result = prom.query(PER_POSITION)
        assert len(result) == 3 * len(RATES)
        for row in result:
            position = int(row["metric"]["position"])
            assert float(row["value"][1]) == pytest.approx(RATES[position], abs=0.01), row

        # Every draft is k=3: draft tokens = 3 x drafts, per engine.
        ratio = prom.query(
            "increase(vllm:spec_decode_num_draft_tokens_total[1m])"
            " / increase(vllm:spec_decode_num_drafts_total[1m])"
        )
        assert [float(r["value"][1]) for r in ratio] == pytest.approx([3.0] * 3)

        # Samples are stamped with Prometheus' wall clock: the counter grows at speed x the
        # simulated rate B / T(B, 3) per wall second.
        step_ms = step_times_of(load_profile(REPO / "examples" / "sample-profile.json")).at(
            BATCH, 3
        )
        expected = SPEED * BATCH / (step_ms / 1000.0)
        for series in prom.query("vllm:spec_decode_num_drafts_total[1m]"):
            (t0, v0), (t1, v1) = series["values"][0], series["values"][-1]
            slope = (float(v1) - float(v0)) / (float(t1) - float(t0))
            assert slope == pytest.approx(expected, rel=0.08), series["metric"]
        acceptance = prom.query_value(
            "sum(rate(vllm:spec_decode_num_accepted_tokens_total[1m]))"
            " / sum(rate(vllm:spec_decode_num_draft_tokens_total[1m]))"
        )
        assert acceptance == pytest.approx(sum(RATES) / 3, abs=0.01)
        tokens = prom.query_value(
            "sum(increase(vllm:generation_tokens_total[1m]))"
            " / sum(increase(vllm:spec_decode_num_drafts_total[1m]))"
        )
        assert tokens == pytest.approx(tau(RATES, 3), abs=0.02)

        # The step cells as Prometheus stores them: every step at B=32 with k=3, one cell per
        # engine; mean batch, tokens per step and step time follow from the sums.
        cells = prom.query("increase(tabletune_steps_total[1m])")
        assert {(r["metric"]["k"], r["metric"]["batch"]) for r in cells} == {("3", "25-32")}
        assert len(cells) == 3
        per_step = " / sum(increase(tabletune_steps_total[1m]))"
        requests = prom.query_value(
            "sum(increase(tabletune_step_scheduled_requests_total[1m]))" + per_step
        )
        assert requests == pytest.approx(BATCH)
        scheduled = prom.query_value(
            "sum(increase(tabletune_step_scheduled_tokens_total[1m]))" + per_step
        )
        assert scheduled == pytest.approx(BATCH * 4)
        seconds = prom.query_value("sum(increase(tabletune_step_seconds_total[1m]))" + per_step)
        assert seconds == pytest.approx(step_ms / 1000.0, rel=1e-6)

        # A restart of one engine is a counter reset for that target only.
        restarted = sim.targets[2]
        assert httpx.post(f"{sim.urls[2]}/sim/v1/restart", json={}).status_code == 200
        query = "resets(vllm:spec_decode_num_drafts_total[1m])"
        prom.wait_for(
            lambda: (
                {r["metric"]["instance"]: float(r["value"][1]) for r in prom.query(query)}
                == {sim.targets[0]: 0.0, sim.targets[1]: 0.0, restarted: 1.0}
            ),
            timeout_s=10,
            what="one counter reset on the restarted engine",
        )

        # Faults as Prometheus sees them: an outage is `up == 0`, a slow scrape a long
        # scrape_duration_seconds, each on its own target.
        httpx.post(f"{sim.urls[0]}/sim/v1/faults", json={"metrics_outage": True})
        httpx.post(f"{sim.urls[1]}/sim/v1/faults", json={"metrics_delay_s": 0.5})

        def faults_seen() -> bool:
            up = {r["metric"]["instance"]: float(r["value"][1]) for r in prom.query("up")}
            took = {
                r["metric"]["instance"]: float(r["value"][1])
                for r in prom.query("scrape_duration_seconds")
            }
            return (
                up[sim.targets[0]] == 0.0
                and up[sim.targets[1]] == 1.0
                and (took[sim.targets[1]] >= 0.5 > took[sim.targets[2]])
            )

        prom.wait_for(faults_seen, timeout_s=10, what="the outage and the slow scrape")
