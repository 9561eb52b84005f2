"""systemd/tabletune.env.example is generated from the daemon's settings model and must agree
with it. Regenerate with:

    .venv/bin/python -c "from tabletune.daemon.settings import render_env_example; \\
        print(render_env_example(), end='')" > systemd/tabletune.env.example
"""

from __future__ import annotations

import re
from pathlib import Path

from tabletune.daemon import settings

from .conftest import DEPLOY, SYSTEMD

EXAMPLE = SYSTEMD / "tabletune.env.example"
VARIABLE = re.compile(r"^#?(TABLETUNE_[A-Z0-9_]+)=(.*)$")


def _variables(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        match = VARIABLE.match(line)
        if match:
            out[match.group(1)] = match.group(2)
    return out


def _known_variables() -> set[str]:
    known = set()
    for group, field in settings.DaemonSettings.model_fields.items():
        for name in field.annotation.model_fields:
            known.add(settings.env_var(group, name))
    return known


def test_env_example_is_generated_from_the_settings_model() -> None:
    assert EXAMPLE.read_text() == settings.render_env_example(), (
        "systemd/tabletune.env.example is stale: regenerate it (see this module's docstring)"
    )


def test_env_example_lists_every_setting_once() -> None:
    listed = [m.group(1) for m in map(VARIABLE.match, EXAMPLE.read_text().splitlines()) if m]
    assert len(listed) == len(set(listed))
    assert set(listed) == _known_variables()


def test_defaults_shown_are_the_real_defaults() -> None:
    # Uncomment every line that shows a value: the daemon must build the same settings.
    shown = {name: value for name, value in _variables(EXAMPLE).items() if value}
    assert shown, "no defaults shown"
    assert settings.load_settings(shown) == settings.load_settings({})


def test_kubernetes_config_names_only_real_settings() -> None:
    for env_file in (DEPLOY / "kubernetes" / "base").glob("*.env"):
        names = set(_variables(env_file))
        assert names, env_file
        assert names <= _known_variables(), f"{env_file.name}: {names - _known_variables()}"
