"""deploy/alertmanager: amtool checks the config and routes every TableTune alert as intended."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from .conftest import DEPLOY, explain, run_tool

CONFIG = DEPLOY / "alertmanager" / "alertmanager.yml"
RULES = DEPLOY / "prometheus" / "rules" / "tabletune.rules.yml"
RECEIVER_BY_SEVERITY = {
    "critical": "tabletune-page",
    "warning": "tabletune-ticket",
    "info": "tabletune-chat",
}


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def routes_test(tool: Callable[[str], str], *labels: str) -> subprocess.CompletedProcess[str]:
    """``amtool config routes test`` on the shipped config: the receiver for these labels."""
    return run_tool(
        [tool("amtool"), "config", "routes", "test", f"--config.file={CONFIG}", *labels]
    )


def test_config_is_valid(tool: Callable[[str], str]) -> None:
    result = run_tool([tool("amtool"), "check-config", str(CONFIG)])
    assert result.returncode == 0, explain(result)


@pytest.mark.parametrize("alert", _alerts(), ids=lambda alert: str(alert["alert"]))
def test_each_alert_reaches_its_receiver(tool: Callable[[str], str], alert: dict[str, Any]) -> None:
    labels = {"alertname": alert["alert"], **alert["labels"]}
    result = routes_test(tool, *(f"{key}={value}" for key, value in labels.items()))
    assert result.returncode == 0, explain(result)
    assert result.stdout.strip() == RECEIVER_BY_SEVERITY[labels["severity"]], explain(result)


def test_other_alerts_do_not_reach_tabletune_receivers(tool: Callable[[str], str]) -> None:
    result = routes_test(tool, "severity=critical")
    assert result.stdout.strip() == "default", explain(result)


@pytest.mark.parametrize("severity", sorted(RECEIVER_BY_SEVERITY))
def test_alerts_posted_by_the_daemon_route_by_name(
    tool: Callable[[str], str], severity: str
) -> None:
    # The daemon's own alerts carry no component label: they must reach the same receivers.
    result = routes_test(
        tool, "alertname=TableTuneStaleData", f"severity={severity}", "replica=a:8000"
    )
    assert result.stdout.strip() == RECEIVER_BY_SEVERITY[severity], explain(result)
