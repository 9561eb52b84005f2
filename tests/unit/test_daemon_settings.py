"""Daemon settings: every default pinned, bad values named by their variable, secrets masked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tabletune.daemon.settings import (
    DaemonSettings,
    deprecations,
    env_var,
    load_settings,
    masked,
    render_env_example,
    setting_overrides,
)
from tabletune.errors import InputError

DEFAULTS = {
    "loop": {
        "interval_s": 15.0,
        "cycle_budget": 0.8,
        "concurrency": 16,
        "forget_after_s": 600.0,
    },
    "source": {
        "prometheus_url": None,
        "replicas": (),
        "replica_label": "instance",
        "admin_url_template": "http://{replica}",
        "timeout_s": 5.0,
        "stale_after_s": 120.0,
        "query_delay_s": 5.0,
        "max_window_s": 900.0,
        "prometheus_username": None,
        "prometheus_password": None,
        "prometheus_password_file": None,
        "prometheus_bearer_token": None,
        "prometheus_bearer_token_file": None,
        "prometheus_ca_file": None,
        "prometheus_tls_verify": True,
    },
    "profile": {"paths": (), "acceptance_path": None},
    "estimator": {
        "prior_weight": 2000.0,
        "rebuild_every_drafts": 10000,
        "prior_decay": True,
        "scope": "replica",
    },
    "step_time": {
        "enabled": True,
        "prior_steps": 10.0,
        "half_life_s": 60.0,
        "prior_sigma": 0.01,
        "correlation": 2.0,
        "shift": 0.4,
        "settle_s": 15.0,
    },
    "decision": {
        "min_gain": 0.01,
        "stickiness": 0.005,
        "load_memory": 0.8,
        "confidence_z": 1.0,
        "replan_change": 0.02,
        "recheck_held_back_s": 30.0,
        "trials": False,
        "trial_z": 1.5,
        "trial_steps": 100.0,
        "trial_max_s": 60.0,
        "trial_retry_s": 600.0,
        "oversold_for_s": 600.0,
        "challenger_min_steps": 0.0,
        "first_sight_from_prior": True,
    },
    "plugin": {
        "exploration_interval": 50,
        "hysteresis": 2,
        "neighbour_interval": 32,
        "neighbour_burst": 4,
        "neighbour_recheck_interval": 128,
        "neighbour_recheck_after_s": 120.0,
        "exploration_cost_budget": 0.002,
        "neighbour_cost_budget": 0.005,
        "neighbour_directed": True,
        "neighbour_drop_z": 1.0,
    },
    "admin": {
        "token": None,
        "token_file": None,
        "timeout_s": 5.0,
        "refresh_s": 300.0,
        "retry_backoffs_s": (1.0, 1.0, 2.0, 3.0, 5.0),
    },
    "guard": {
        "enabled": True,
        "max_drop": 0.15,
        "load_tolerance": 0.10,
        "window_s": 300.0,
        "min_samples": 3,
        "cooldown_s": 900.0,
    },
    "drift": {"acceptance_threshold": 0.15, "profile_threshold": 0.25, "min_steps": 100},
    "alerts": {
        "alertmanager_url": None,
        "username": None,
        "password": None,
        "bearer_token": None,
        "event_ttl_s": 900.0,
        "keep_events": 1000,
        "timeout_s": 5.0,
    },
    "server": {"host": "127.0.0.1", "port": 9465},
    "state": {"dir": Path("/var/lib/tabletune")},
    "log": {"level": "info", "format": "json"},
}


def test_every_default_is_pinned() -> None:
    settings = load_settings({})
    assert settings.model_dump() == DEFAULTS


def test_every_field_is_documented_and_in_the_env_example() -> None:
    example = render_env_example()
    for group, field in DaemonSettings.model_fields.items():
        model = field.annotation
        assert isinstance(model, type)
        for name, sub in model.model_fields.items():  # type: ignore[attr-defined]
            assert sub.description, f"{group}.{name} has no description"
            assert f"#{env_var(group, name)}=" in example


def test_env_example_shows_defaults() -> None:
    example = render_env_example()
    assert "#TABLETUNE_ESTIMATOR__PRIOR_WEIGHT=2000.0" in example
    assert "#TABLETUNE_ADMIN__RETRY_BACKOFFS_S=1.0,1.0,2.0,3.0,5.0" in example
    assert "#TABLETUNE_GUARD__ENABLED=true" in example


def test_lists_are_comma_separated() -> None:
    settings = load_settings(
        {
            "TABLETUNE_SOURCE__REPLICAS": "http://a:8000, http://b:8000",
            "TABLETUNE_ADMIN__RETRY_BACKOFFS_S": "0.5,2",
            "TABLETUNE_PROFILE__PATHS": "p1.json,p2.json",
        }
    )
    assert settings.source.replicas == ("http://a:8000", "http://b:8000")
    assert settings.admin.retry_backoffs_s == (0.5, 2.0)
    assert settings.profile.paths == (Path("p1.json"), Path("p2.json"))


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("TABLETUNE_LOOP__INTERVAL_S", "soon", "valid number"),
        ("TABLETUNE_LOOP__INTERVAL_S", "-1", "greater than 0"),
        ("TABLETUNE_ESTIMATOR__SCOPE", "cluster", "'replica' or 'pool'"),
        ("TABLETUNE_ADMIN__RETRY_BACKOFFS_S", "1,x", "valid number"),
        ("TABLETUNE_GUARD__ENABLED", "perhaps", "boolean"),
        ("TABLETUNE_SERVER__PORT", "70000", "less than or equal"),
        # a burst of one step is all switch steps: the plugin would time none of it
        ("TABLETUNE_PLUGIN__NEIGHBOUR_BURST", "1", "greater than or equal to 2"),
    ],
)
def test_bad_values_name_the_variable(variable: str, value: str, words: str) -> None:
    with pytest.raises(InputError) as caught:
        load_settings({variable: value})
    assert str(caught.value).startswith(variable + ":")
    assert words in str(caught.value)


def test_real_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TABLETUNE_DECISION__MIN_GAIN", "0.05")
    assert load_settings().decision.min_gain == 0.05


def test_bad_env_at_start_is_one_clear_line_and_exit_2(tmp_path: Path) -> None:
    env = {"TABLETUNE_DRIFT__MIN_STEPS": "many", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "tabletune.cli.main", "daemon", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert "TABLETUNE_DRIFT__MIN_STEPS" in done.stderr
    assert "Traceback" not in done.stderr


def test_secrets_are_masked() -> None:
    settings = load_settings(
        {
            "TABLETUNE_ADMIN_TOKEN": "hunter2",
            "TABLETUNE_ALERTS__PASSWORD": "s3cret",
            "TABLETUNE_ALERTS__BEARER_TOKEN": "tok",
            "TABLETUNE_ALERTS__USERNAME": "ops",
        }
    )
    shown = masked(settings)
    text = repr(shown)
    assert "hunter2" not in text and "s3cret" not in text and "'tok'" not in text
    assert shown["admin"]["token"] == "***"
    assert shown["alerts"]["username"] == "ops"
    assert settings.admin.token is not None and settings.admin.token.get_secret_value() == "hunter2"


def test_the_admin_token_has_the_plugins_variable_names() -> None:
    assert env_var("admin", "token") == "TABLETUNE_ADMIN_TOKEN"
    assert env_var("admin", "token_file") == "TABLETUNE_ADMIN_TOKEN_FILE"
    assert env_var("admin", "timeout_s") == "TABLETUNE_ADMIN__TIMEOUT_S"
    loaded = load_settings(
        {"TABLETUNE_ADMIN_TOKEN": "new-0123456789abcdef", "TABLETUNE_ADMIN__TIMEOUT_S": "3"}
    )
    assert loaded.admin.token is not None
    assert loaded.admin.token.get_secret_value() == "new-0123456789abcdef"
    assert loaded.admin.timeout_s == 3.0
    assert load_settings({"TABLETUNE_ADMIN_TOKEN_FILE": "/run/t"}).admin.token_file == Path(
        "/run/t"
    )


def test_the_real_environment_reads_the_shared_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TABLETUNE_ADMIN_TOKEN", "env-0123456789abcdef")
    monkeypatch.setenv("TABLETUNE_ADMIN__TOKEN", "old-0123456789abcdef")
    token = load_settings().admin.token
    assert token is not None and token.get_secret_value() == "env-0123456789abcdef"


def test_the_old_token_name_still_works_with_a_warning() -> None:
    old = {"TABLETUNE_ADMIN__TOKEN": "old-0123456789abcdef"}
    token = load_settings(old).admin.token
    assert token is not None and token.get_secret_value() == "old-0123456789abcdef"
    [warning] = deprecations(old)
    assert "TABLETUNE_ADMIN__TOKEN is deprecated, use TABLETUNE_ADMIN_TOKEN" in warning
    both = {**old, "TABLETUNE_ADMIN_TOKEN": "new-0123456789abcdef"}
    token = load_settings(both).admin.token
    assert token is not None and token.get_secret_value() == "new-0123456789abcdef"
    assert "ignored" in deprecations(both)[0]
    assert deprecations({"TABLETUNE_ADMIN_TOKEN": "x"}) == []


def test_prometheus_credentials_are_masked_wherever_they_are_given() -> None:
    settings = load_settings(
        {
            "TABLETUNE_SOURCE__PROMETHEUS_URL": "https://prom:9090",
            "TABLETUNE_SOURCE__PROMETHEUS_USERNAME": "ops",
            "TABLETUNE_SOURCE__PROMETHEUS_PASSWORD": "pa55",
        }
    )
    shown = masked(settings)["source"]
    assert shown["prometheus_password"] == "***" and shown["prometheus_username"] == "ops"
    in_url = masked(
        load_settings({"TABLETUNE_SOURCE__PROMETHEUS_URL": "https://ops:pa55@prom:9090/x"})
    )
    assert in_url["source"]["prometheus_url"] == "https://ops:***@prom:9090/x"
    token = masked(load_settings({"TABLETUNE_SOURCE__PROMETHEUS_BEARER_TOKEN": "t0ken"}))
    assert "t0ken" not in repr(token)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PROMETHEUS_PASSWORD": "p"}, "needs TABLETUNE_SOURCE__PROMETHEUS_USERNAME"),
        (
            {
                "PROMETHEUS_PASSWORD": "p",
                "PROMETHEUS_PASSWORD_FILE": "/f",
                "PROMETHEUS_USERNAME": "u",
            },
            "not both",
        ),
        ({"PROMETHEUS_USERNAME": "u", "PROMETHEUS_BEARER_TOKEN": "t"}, "basic auth or a bearer"),
        (
            {"PROMETHEUS_URL": "http://u:p@prom", "PROMETHEUS_BEARER_TOKEN_FILE": "/t"},
            "carries credentials",
        ),
        ({"PROMETHEUS_CA_FILE": "/ca.pem", "PROMETHEUS_TLS_VERIFY": "false"}, "ignores it"),
    ],
)
def test_conflicting_prometheus_auth_is_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(InputError, match=message):
        load_settings({f"TABLETUNE_SOURCE__{k}": v for k, v in env.items()})


def test_overrides_are_named_as_variables_less_the_prefix_and_checked_as_the_daemon_would() -> None:
    assert setting_overrides(["decision__trials=true", "STEP_TIME__SETTLE_S=0"]) == {
        "DECISION__TRIALS": "true", "STEP_TIME__SETTLE_S": "0"}  # fmt: skip
    assert setting_overrides([]) == {}


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("DECISION__TRIALS", "GROUP__NAME=VALUE"),  # no value
        ("TRIALS=true", "GROUP__NAME=VALUE"),  # no group
        ("=true", "GROUP__NAME=VALUE"),
        ("NO_SUCH__TRIALS=true", "NO_SUCH"),  # an unknown group: not ignored
        ("TABLETUNE_DECISION__TRIALS=true", "TABLETUNE_DECISION"),  # the prefix is not given
        ("DECISION__NO_SUCH=1", "NO_SUCH"),  # an unknown setting of a known group
        ("DECISION__TRIALS=perhaps", "TABLETUNE_DECISION__TRIALS"),  # a bad value
    ],
)
def test_a_bad_override_is_refused_naming_it(bad: str, says: str) -> None:
    with pytest.raises(InputError, match=says):
        setting_overrides([bad])
