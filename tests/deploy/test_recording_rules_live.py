"""The recording rules on live series: the engine emulator (same metric names and labels as vLLM
with the plugin) scraped by a real Prometheus that loads the shipped rules file. The emulator's
steady scenario runs k=3 at B=32 with acceptance a = (0.8, 0.6, 0.4), so the per-position
acceptance recorded for 0-based positions 0, 1, 2 must come out near those values."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.servers import free_port, prometheus, python_command, running

from .conftest import DEPLOY

pytestmark = pytest.mark.integration

RULES = DEPLOY / "prometheus" / "rules" / "tabletune.rules.yml"
ACCEPTANCE = "tabletune:spec_decode_acceptance_per_pos:ratio_rate5m"
SCENARIO_RATES = {"0": 0.8, "1": 0.6, "2": 0.4}


def test_recorded_acceptance_per_position_matches_the_emulated_engine(tmp_path: Path) -> None:
    port = free_port()
    sim = python_command(
        "-m", "tabletune.cli.main", "sim", "serve", "--scenario", "steady",
        "--host", "127.0.0.1", "--port", str(port),
    )  # fmt: skip
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    with (
        running(sim, ready_url=metrics_url, log_path=tmp_path / "sim.log"),
        prometheus(tmp_path, [f"127.0.0.1:{port}"], job="vllm", rule_files=[RULES]) as prom,
    ):
        prom.wait_for_targets_up(count=1)

        def all_positions() -> dict[str, float] | None:
            result = prom.query(ACCEPTANCE)
            values = {r["metric"]["position"]: float(r["value"][1]) for r in result}
            return values if values.keys() >= SCENARIO_RATES.keys() else None

        prom.wait_for(all_positions, timeout_s=30.0, what=ACCEPTANCE)
        prom.wait_for_samples(ACCEPTANCE, minimum=3, timeout_s=30.0)
        recorded = all_positions()
        series = prom.query(ACCEPTANCE)
    assert recorded is not None
    assert {r["metric"]["model_name"] for r in series} == {"qwen3-4b"}
    assert {r["metric"]["job"] for r in series} == {"vllm"}
    for position, rate in SCENARIO_RATES.items():
        assert recorded[position] == pytest.approx(rate, abs=0.05), position
