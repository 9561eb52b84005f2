"""vLLM's metric names as Prometheus stores them, through the shipped scrape config.

vLLM serves /metrics with prometheus_client's content negotiation; Prometheus asks for
OpenMetrics, and in that format prometheus_client writes "vllm:..." sample names as "vllm_...".
The exporter here serves exactly that way (prometheus_client's own HTTP server, the same
negotiation as vLLM's ``make_asgi_app``), so the test fails if the shipped relabel goes missing:
the rules are written against vLLM's documented "vllm:" names."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.servers import free_port, prometheus, running

from .conftest import DEPLOY

pytestmark = pytest.mark.integration

SHIPPED = DEPLOY / "prometheus" / "prometheus.yml"
RULES = DEPLOY / "prometheus" / "rules" / "tabletune.rules.yml"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
ACCEPTANCE = "tabletune:spec_decode_acceptance_per_pos:ratio_rate5m"
DRAFTED = "tabletune_spec_decode_num_draft_tokens_per_pos_total"  # no colon: never renamed

EXPORTER = """
import sys, time
from prometheus_client import CollectorRegistry, Counter, start_http_server
registry = CollectorRegistry()
accepted = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per position.",
                   ["model_name", "engine", "position"], registry=registry)
drafted = Counter("tabletune_spec_decode_num_draft_tokens_per_pos", "Draft tokens per position.",
                  ["model_name", "engine", "position"], registry=registry)
start_http_server(int(sys.argv[1]), addr="127.0.0.1", registry=registry)
while True:  # 100 drafts per position per 0.1 s; acceptance 0.8 / 0.6 / 0.4
    for position, rate in enumerate((0.8, 0.6, 0.4)):
        drafted.labels("m", "0", str(position)).inc(100)
        accepted.labels("m", "0", str(position)).inc(100 * rate)
    time.sleep(0.1)
"""


def shipped_config(target: str, *, relabel: bool) -> dict[str, Any]:
    """The shipped config with its vLLM job pointed at ``target`` (and only that job)."""
    config = yaml.safe_load(SHIPPED.read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "vllm")
    job["static_configs"] = [{"targets": [target]}]
    job["scrape_interval"] = "1s"
    if not relabel:
        job.pop("metric_relabel_configs")
    config["scrape_configs"] = [job]
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(RULES.resolve())]
    config.pop("alerting", None)
    return config


@pytest.mark.parametrize("relabel", [True, False], ids=["shipped", "without-relabel"])
def test_rules_see_vllm_names_from_an_openmetrics_scrape(tmp_path: Path, relabel: bool) -> None:
    port = free_port()
    script = tmp_path / "exporter.py"
    script.write_text(EXPORTER)
    exporter = [sys.executable, str(script), str(port)]
    with (
        running(exporter, ready_url=f"http://127.0.0.1:{port}/metrics", log_path=tmp_path / "e"),
        prometheus(tmp_path, config=shipped_config(f"127.0.0.1:{port}", relabel=relabel)) as prom,
    ):
        prom.wait_for_targets_up(count=1)
        prom.wait_for_samples(DRAFTED + '{position="0"}', minimum=3)
        names = {r["metric"]["__name__"] for r in prom.query('{job="vllm", position="0"}')}
        if relabel:
            prom.wait_for_samples(ACCEPTED, minimum=3)
            assert ACCEPTED in names
            assert "vllm_spec_decode_num_accepted_tokens_per_pos_total" not in names
            recorded = prom.wait_for(
                lambda: prom.query_value(ACCEPTANCE + '{position="0"}'), what=ACCEPTANCE
            )
            assert recorded == pytest.approx(0.8, abs=0.02)
        else:
            # the failure mode the relabel exists for: rules on "vllm:" would find nothing
            assert "vllm_spec_decode_num_accepted_tokens_per_pos_total" in names
            assert prom.query(ACCEPTED) == []
