"""deploy/prometheus: promtool checks the config and rules and runs the rules' unit tests."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tabletune import metric_names as names
from tabletune.daemon.alerts import SEVERITY
from tabletune.daemon.metrics import DaemonMetrics

from .conftest import DEPLOY, explain, run_tool

PROMETHEUS = DEPLOY / "prometheus"
RULES = PROMETHEUS / "rules" / "tabletune.rules.yml"
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.test.yml"))


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _alert_names() -> set[str]:
    return {
        rule["alert"]
        for group in _load(RULES)["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def test_config_is_valid(tool: Callable[[str], str]) -> None:
    result = run_tool([tool("promtool"), "check", "config", str(PROMETHEUS / "prometheus.yml")])
    assert result.returncode == 0, explain(result)
    assert "1 rule files found" in result.stdout + result.stderr


def test_rules_are_valid(tool: Callable[[str], str]) -> None:
    result = run_tool([tool("promtool"), "check", "rules", str(RULES)])
    assert result.returncode == 0, explain(result)


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=lambda path: path.name)
def test_rule_unit_tests_pass(tool: Callable[[str], str], test_file: Path) -> None:
    result = run_tool([tool("promtool"), "test", "rules", test_file.name], cwd=test_file.parent)
    assert result.returncode == 0, explain(result)


def test_every_alert_has_a_firing_unit_test() -> None:
    fired: set[str] = set()
    for test_file in RULE_TESTS:
        for case in _load(test_file)["tests"]:
            for check in case.get("alert_rule_test", []):
                if check.get("exp_alerts"):
                    fired.add(check["alertname"])
    assert _alert_names() - fired == set(), "alerts without a test that makes them fire"
    assert fired - _alert_names() == set(), "tests for alerts that no longer exist"


def test_unit_tests_catch_a_broken_rule(tool: Callable[[str], str], tmp_path: Path) -> None:
    # The unit tests must be able to fail: raise one threshold and the rollback test must break.
    broken = tmp_path / "rules"
    broken.mkdir()
    text = RULES.read_text()
    assert "increase(tabletune_daemon_rollbacks_total[15m]) > 0" in text
    (broken / RULES.name).write_text(
        text.replace("increase(tabletune_daemon_rollbacks_total[15m]) > 0", "vector(0) > 1")
    )
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(PROMETHEUS / "tests" / "rollback.test.yml", tests)
    result = run_tool([tool("promtool"), "test", "rules", "rollback.test.yml"], cwd=tests)
    assert result.returncode != 0, explain(result)


def test_rules_use_the_shared_metric_names() -> None:
    # The plugin and emulator publish these names (metric_names.py); a rename must show up here.
    text = RULES.read_text()
    for counter in (names.VLLM_ACCEPTED_PER_POS, names.TT_DRAFT_TOKENS_PER_POS):
        assert f"{counter}_total" in text
    for counter in (names.TT_STEPS, names.TT_STEP_SECONDS):
        assert f"{counter}_total" in text
    assert names.TT_TABLE_VERSION in text
    assert names.VLLM_NUM_REQUESTS_RUNNING in text
    for label in (names.LABEL_POSITION, names.LABEL_MODEL, names.LABEL_K, names.LABEL_BATCH):
        assert label in text


def test_scrape_config_has_the_daemon_job_the_alert_expects() -> None:
    jobs = {job["job_name"] for job in _load(PROMETHEUS / "prometheus.yml")["scrape_configs"]}
    assert "tabletune-daemon" in jobs
    assert 'up{job="tabletune-daemon"}' in RULES.read_text()


def _exported_daemon_series() -> set[str]:
    series: set[str] = set()
    for family in DaemonMetrics().registry.collect():
        series.add(family.name)
        if family.type == "counter":
            series.add(f"{family.name}_total")
    return series


def test_rules_read_only_series_the_daemon_exports() -> None:
    used = set(re.findall(r"tabletune_daemon_[a-z_]+", RULES.read_text()))
    assert used, "the rules use no daemon series"
    assert used <= _exported_daemon_series(), used - _exported_daemon_series()


def test_alerts_the_daemon_also_posts_have_the_same_severity() -> None:
    rules = {
        rule["alert"]: rule["labels"]["severity"]
        for group in _load(RULES)["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    shared = rules.keys() & SEVERITY.keys()
    assert {"TableTuneStaleData", "TableTuneRollback", "TableTuneAcceptanceDrift"} <= shared
    assert {name: rules[name] for name in shared} == {name: SEVERITY[name] for name in shared}


def test_every_alert_has_a_runbook_section_in_the_operator_guide() -> None:
    guide = (DEPLOY.parent / "docs" / "operator-guide.md").read_text()
    headings = {line[4:].strip().lower() for line in guide.splitlines() if line.startswith("### ")}
    for group in _load(RULES)["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            runbook = rule["annotations"]["runbook"]
            assert runbook == f"docs/operator-guide.md#{rule['alert'].lower()}"
            assert rule["alert"].lower() in headings, rule["alert"]
