"""The real-server helpers work: Prometheus scrapes, evaluates a rule and alerts Alertmanager."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import PrometheusFactory
from tests.support.servers import AlertmanagerServer

pytestmark = pytest.mark.integration

ALWAYS_FIRING = """
groups:
  - name: helper-check
    rules:
      - alert: HelperCheckAlwaysFiring
        expr: vector(1)
        labels: {severity: info}
"""


def test_prometheus_scrapes_and_alerts_reach_alertmanager(
    tmp_path: Path,
    prometheus_factory: PrometheusFactory,
    alertmanager_server: AlertmanagerServer,
) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(ALWAYS_FIRING, encoding="utf-8")
    prom = prometheus_factory(
        [alertmanager_server.address],
        job="alertmanager",
        rule_files=[rules],
        alertmanager=alertmanager_server.address,
    )
    prom.wait_for_targets_up(count=1)
    assert prom.query_value('up{job="alertmanager"}') == 1.0
    alert = alertmanager_server.wait_for_alert("HelperCheckAlwaysFiring", timeout_s=20)
    assert alert["labels"]["severity"] == "info"


def test_prometheus_sees_a_target_down(prometheus_factory: PrometheusFactory) -> None:
    from tests.support.servers import free_port

    prom = prometheus_factory([f"127.0.0.1:{free_port()}"])
    prom.wait_for(
        lambda: prom.query_value("up") == 0.0, timeout_s=10, what="the missing target down"
    )
