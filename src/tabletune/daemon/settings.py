"""The daemon's configuration: ``TABLETUNE_*`` environment variables only.

One ``DaemonSettings`` object made of grouped sub-models, built once at start and passed down as
a keyword-only ``settings=`` argument. Nested fields are ``TABLETUNE_<GROUP>__<FIELD>``, e.g.
``TABLETUNE_SOURCE__PROMETHEUS_URL``, except the admin token's, which the vLLM plugin reads too:
``TABLETUNE_ADMIN_TOKEN`` and ``TABLETUNE_ADMIN_TOKEN_FILE`` (``SHARED_NAMES``; the old
``TABLETUNE_ADMIN__TOKEN`` still works, with a warning). Lists are comma-separated.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import (
    BaseModel,
    SecretStr,
    ValidationError,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from tabletune.admin.auth import TOKEN_ENV, TOKEN_FILE_ENV
from tabletune.daemon.setting_groups import (
    AdminSettings,
    AlertSettings,
    DecisionSettings,
    DriftSettings,
    EstimatorSettings,
    GuardSettings,
    LogSettings,
    LoopSettings,
    PluginSettings,
    ProfileSettings,
    ServerSettings,
    SourceSettings,
    StateSettings,
    StepTimeSettings,
)
from tabletune.errors import InputError

# The groups are defined in ``daemon.setting_groups``; modules import them from here.
__all__ = [
    "AdminSettings",
    "AlertSettings",
    "BaseSettings",
    "DaemonSettings",
    "DecisionSettings",
    "DriftSettings",
    "EstimatorSettings",
    "GuardSettings",
    "LogSettings",
    "LoopSettings",
    "PluginSettings",
    "ProfileSettings",
    "ServerSettings",
    "SourceSettings",
    "StateSettings",
    "StepTimeSettings",
    "deprecations",
    "env_name",
    "env_var",
    "load_settings",
    "mask_credentials",
    "masked",
    "render_env_example",
    "shared_values",
]

ENV_PREFIX = "TABLETUNE_"
NESTED = "__"
# (group, field) -> the variable, where it is not TABLETUNE_<GROUP>__<FIELD>: one name for the
# daemon and the plugin.
SHARED_NAMES = {("admin", "token"): TOKEN_ENV, ("admin", "token_file"): TOKEN_FILE_ENV}


def env_var(group: str, field: str) -> str:
    """The variable that sets ``group.field``."""
    return SHARED_NAMES.get((group, field), f"{ENV_PREFIX}{group.upper()}{NESTED}{field.upper()}")


def shared_values(env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """The settings given by their shared names, nested as the settings model holds them."""
    upper = {key.upper(): value for key, value in env.items()}
    out: dict[str, dict[str, str]] = {}
    for (group, field), name in SHARED_NAMES.items():
        if name in upper:
            out.setdefault(group, {})[field] = upper[name]
    return out


def deprecations(env: Mapping[str, str]) -> list[str]:
    """Warnings for the old spellings of the shared names (they still work)."""
    upper = {key.upper() for key in env}
    warnings = []
    for (group, field), name in SHARED_NAMES.items():
        old = f"{ENV_PREFIX}{group.upper()}{NESTED}{field.upper()}"
        if old in upper:
            effect = "ignored: it is set too" if name in upper else "still read for now"
            warnings.append(f"{old} is deprecated, use {name} (the plugin's name); {effect}")
    return warnings


class _SharedNamesSource(PydanticBaseSettingsSource):
    """Reads ``SHARED_NAMES`` from the process environment (ahead of the nested names)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # everything comes from __call__

    def __call__(self) -> dict[str, Any]:
        return shared_values(os.environ)


class DaemonSettings(BaseSettings):
    """Everything the daemon reads from the environment."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=NESTED, extra="ignore", frozen=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        shared = _SharedNamesSource(settings_cls)
        return init_settings, shared, env_settings, dotenv_settings, file_secret_settings

    loop: LoopSettings = LoopSettings()
    source: SourceSettings = SourceSettings()
    profile: ProfileSettings = ProfileSettings()
    estimator: EstimatorSettings = EstimatorSettings()
    step_time: StepTimeSettings = StepTimeSettings()
    decision: DecisionSettings = DecisionSettings()
    plugin: PluginSettings = PluginSettings()
    admin: AdminSettings = AdminSettings()
    guard: GuardSettings = GuardSettings()
    drift: DriftSettings = DriftSettings()
    alerts: AlertSettings = AlertSettings()
    server: ServerSettings = ServerSettings()
    state: StateSettings = StateSettings()
    log: LogSettings = LogSettings()


def env_name(loc: tuple[int | str, ...]) -> str:
    """Validation location -> the environment variable a user sets."""
    names = [str(part) for part in loc if not isinstance(part, int)]
    if len(names) >= 2:
        return env_var(names[0], names[1])
    return ENV_PREFIX + NESTED.join(name.upper() for name in names)


def load_settings(env: dict[str, str] | None = None) -> DaemonSettings:
    """Build the settings from the environment (or ``env``); InputError names the variable."""
    try:
        if env is None:
            return DaemonSettings()
        return _from_mapping(env)
    except ValidationError as error:
        first = error.errors()[0]
        more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
        value = first.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        raise InputError(f"{env_name(first['loc'])}: {first['msg']}{shown}{more}") from None
    except ValueError as error:  # pydantic-settings' SettingsError for undecodable values
        raise InputError(f"bad TABLETUNE_* environment: {error}") from None


def setting_overrides(items: Iterable[str]) -> dict[str, str]:
    """``GROUP__NAME=VALUE`` items (a daemon variable less its TABLETUNE_ prefix), as the
    benchmarks and replays take them, by upper-cased name. InputError names the first bad one:
    not of that form, of no settings group (the environment would ignore it), or refused by the
    daemon's own settings."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        group, _, field = name.lower().partition(NESTED)
        if not sep or not group or not field:
            raise InputError(f"{item!r}: expected GROUP__NAME=VALUE")
        if group not in DaemonSettings.model_fields:
            raise InputError(f"{item!r}: {group.upper()} is no group of the daemon's settings")
        env[name.upper()] = value
    load_settings({ENV_PREFIX + name: value for name, value in env.items()})
    return env


def _from_mapping(env: dict[str, str]) -> DaemonSettings:
    data: dict[str, Any] = {}
    for key, value in env.items():
        if not key.upper().startswith(ENV_PREFIX):
            continue
        group, _, field = key[len(ENV_PREFIX) :].lower().partition(NESTED)
        if group in DaemonSettings.model_fields and field:
            data.setdefault(group, {})[field] = value
    for group, values in shared_values(env).items():
        data.setdefault(group, {}).update(values)
    return DaemonSettings.model_validate(data)


# the userinfo of a URL: "user:password@" or "token@"
_URL_CREDENTIALS = re.compile(r"(?<=://)([^/@\s:]+)(:[^/@\s]*)?@")


def mask_credentials(text: str) -> str:
    """Every URL in ``text`` with its password (or a lone user part, often a token) shown
    as ``***``: ``http://ops:s3cret@prom:9090`` -> ``http://ops:***@prom:9090``."""
    return _URL_CREDENTIALS.sub(
        lambda m: f"{m.group(1)}:***@" if m.group(2) is not None else "***@", text
    )


def masked(settings: DaemonSettings) -> dict[str, Any]:
    """The effective config for the start-up log: secrets shown as '***' (or null), URL
    credentials masked."""
    data: dict[str, Any] = settings.model_dump(mode="json")
    for group_name in DaemonSettings.model_fields:
        group = getattr(settings, group_name)
        shown = data[group_name]
        for name, value in shown.items():
            if isinstance(getattr(group, name), SecretStr):
                shown[name] = "***"
            elif isinstance(value, str):
                shown[name] = mask_credentials(value)
            elif isinstance(value, list):
                shown[name] = [mask_credentials(v) if isinstance(v, str) else v for v in value]
    return data


def render_env_example() -> str:
    """Every TABLETUNE_* variable with its default and meaning (for systemd/tabletune.env)."""
    lines = [
        "# TableTune daemon configuration (tabletune daemon). Every variable is optional;",
        "# the value shown is the default. Lists are comma-separated.",
    ]
    for group_name, group_field in DaemonSettings.model_fields.items():
        group_model = group_field.annotation
        assert isinstance(group_model, type) and issubclass(group_model, BaseModel)
        lines.append("")
        lines.append(f"# --- {group_name} ---")
        for field_name, field in group_model.model_fields.items():
            default = field.get_default(call_default_factory=True)
            if isinstance(default, tuple):
                shown = ",".join(str(item) for item in default)
            elif default is None:
                shown = ""
            elif isinstance(default, bool):
                shown = str(default).lower()
            else:
                shown = str(default)
            lines.append(f"# {field.description}")
            lines.append(f"#{env_var(group_name, field_name)}={shown}")
    return "\n".join(lines) + "\n"
