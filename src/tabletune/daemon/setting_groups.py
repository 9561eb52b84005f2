"""The daemon's setting groups, one model per ``TABLETUNE_<GROUP>__*`` family, each with
its defaults, bounds and the checks that involve only its own fields. ``daemon.settings``
assembles them into ``DaemonSettings`` and reads the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    NoDecode,
)

from tabletune.daemon.step_time import StepTimeEstimator, StepTimeParams
from tabletune.step_cells import StepCells


def _split_list(value: object) -> object:
    """``"a, b"`` -> ``("a", "b")``; JSON-looking lists are left to pydantic."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            import json

            try:
                return json.loads(text)
            except json.JSONDecodeError:
                raise ValueError("not a valid JSON list") from None
        return tuple(part.strip() for part in text.split(",") if part.strip())
    return value


class _Group(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LoopSettings(_Group):
    interval_s: float = Field(
        default=15.0, gt=0, description="seconds between two evaluations (cycles)"
    )
    cycle_budget: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description=(
            "share of the interval a cycle waits for replicas; a replica that has not answered "
            "by then is that replica's problem this cycle"
        ),
    )
    concurrency: int = Field(
        default=16, ge=1, le=1024, description="replicas scraped or called at once"
    )
    forget_after_s: float = Field(
        default=600.0,
        gt=0,
        description=(
            "forget a replica without data this long: its alerts resolve, its series and "
            "saved state go"
        ),
    )


_S = "TABLETUNE_SOURCE__"  # for messages naming the variables


class SourceSettings(_Group):
    prometheus_url: str | None = Field(
        default=None,
        description="Prometheus base URL; empty: scrape each replica's /metrics directly",
    )
    replicas: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description=(
            "static replica base URLs (comma-separated), serving both /metrics and the admin "
            "API; required without Prometheus, a filter on discovered replicas with it"
        ),
    )
    replica_label: str = Field(
        default="instance", description="Prometheus label that names a replica"
    )
    admin_url_template: str = Field(
        default="http://{replica}",
        description="admin base URL of a replica discovered in Prometheus ({replica} = label)",
    )
    timeout_s: float = Field(default=5.0, gt=0, description="scrape/query timeout in seconds")
    stale_after_s: float = Field(
        default=120.0,
        gt=0,
        description=(
            "data older than this is stale: no push, alert (direct: a new baseline; "
            "Prometheus: how far before a window its base scrape is looked for)"
        ),
    )
    query_delay_s: float = Field(
        default=5.0, ge=0, description="evaluate Prometheus this far in the past (scrape lag)"
    )
    max_window_s: float = Field(
        default=900.0, gt=0, description="longest Prometheus window after a gap (seconds)"
    )
    prometheus_username: str | None = Field(
        default=None, description="Prometheus basic-auth user (with a password or password file)"
    )
    prometheus_password: SecretStr | None = Field(
        default=None, description="Prometheus basic-auth password"
    )
    prometheus_password_file: Path | None = Field(
        default=None, description="file holding the Prometheus basic-auth password"
    )
    prometheus_bearer_token: SecretStr | None = Field(
        default=None, description="Prometheus bearer token"
    )
    prometheus_bearer_token_file: Path | None = Field(
        default=None,
        description="file holding the Prometheus bearer token (re-read on every query)",
    )
    prometheus_ca_file: Path | None = Field(
        default=None, description="CA bundle (PEM) that signs Prometheus's TLS certificate"
    )
    prometheus_tls_verify: bool = Field(
        default=True, description="verify Prometheus's TLS certificate (false: do not check it)"
    )

    _split = field_validator("replicas", mode="before")(lambda cls, v: _split_list(v))

    @model_validator(mode="after")
    def _one_way_to_authenticate(self) -> SourceSettings:
        url_credentials = bool(self.prometheus_url and urlsplit(self.prometheus_url).username)
        password = self.prometheus_password is not None or self.prometheus_password_file
        token = self.prometheus_bearer_token is not None or self.prometheus_bearer_token_file
        problems = [
            (self.prometheus_password is not None and self.prometheus_password_file is not None,
             f"give {_S}PROMETHEUS_PASSWORD or {_S}PROMETHEUS_PASSWORD_FILE, not both"),
            (self.prometheus_bearer_token is not None
             and self.prometheus_bearer_token_file is not None,
             f"give {_S}PROMETHEUS_BEARER_TOKEN or {_S}PROMETHEUS_BEARER_TOKEN_FILE, not both"),
            (bool(password) and self.prometheus_username is None,
             f"a Prometheus password needs {_S}PROMETHEUS_USERNAME"),
            (self.prometheus_username is not None and bool(token),
             "give Prometheus basic auth or a bearer token, not both"),
            (url_credentials and (self.prometheus_username is not None or bool(token)),
             f"{_S}PROMETHEUS_URL carries credentials: give them there or in the "
             "PROMETHEUS_* auth settings, not both"),
            (self.prometheus_ca_file is not None and not self.prometheus_tls_verify,
             f"{_S}PROMETHEUS_CA_FILE is set but {_S}PROMETHEUS_TLS_VERIFY=false ignores it"),
        ]  # fmt: skip
        for broken, message in problems:
            if broken:
                raise ValueError(message)
        return self


class ProfileSettings(_Group):
    paths: Annotated[tuple[Path, ...], NoDecode] = Field(
        default=(),
        description=(
            "profile JSON files (comma-separated); replicas are matched by model name, "
            "replicas sharing a profile form a pool"
        ),
    )
    acceptance_path: Path | None = Field(
        default=None,
        description="AcceptanceProfile JSON for the prior a_i (default: the profile's own)",
    )

    _split = field_validator("paths", mode="before")(lambda cls, v: _split_list(v))


class EstimatorSettings(_Group):
    prior_weight: float = Field(default=2000.0, ge=0, description="w: weight of the prior a_i")
    rebuild_every_drafts: int = Field(
        default=10000, ge=1, description="rebuild the estimate every N new drafts"
    )
    prior_decay: bool = Field(
        default=True,
        description="halve w after every rebuild (the prior then only matters until data comes)",
    )
    scope: Literal["replica", "pool"] = Field(
        default="replica", description="estimate acceptance per replica or per pool"
    )


class DecisionSettings(_Group):
    min_gain: float = Field(
        default=0.01,
        ge=0,
        description="push only when predicted goodput over recent load improves by more",
    )
    stickiness: float = Field(
        default=0.005, ge=0, description="keep the previous k unless another is this much better"
    )
    load_memory: float = Field(
        default=0.8,
        ge=0,
        lt=1,
        description="weight kept by the load distribution each cycle (0: last cycle only)",
    )
    confidence_z: float = Field(
        default=1.0,
        ge=0,
        description="a range changes k only when the predicted gain exceeds z standard errors",
    )
    replan_change: float = Field(
        default=0.02,
        gt=0,
        description="decide again when T_hat where the load runs moved by more than this",
    )
    recheck_held_back_s: float = Field(
        default=30.0,
        gt=0,
        description="decide again this long after a decision that kept a gain out as noise "
        "(evidence can clear it without moving the estimates past replan_change)",
    )
    trials: bool = Field(
        default=False,
        description=(
            "where only neighbour bursts measured a k that could beat the table's k at the "
            "load, put it in for the load's batch cell so it is judged on a run of its own "
            "(bursts alone then never put a k in there)"
        ),
    )
    trial_z: float = Field(
        default=1.5,
        ge=0,
        description="a k is tried when, this many standard errors faster, it would win",
    )
    trial_steps: float = Field(
        default=100.0,
        gt=0,
        description="steps a k ran as its cell's main k after which it counts as tried",
    )
    trial_max_s: float = Field(
        default=60.0,
        gt=0,
        description="a trial is settled after this long even if its k ran fewer steps",
    )
    trial_retry_s: float = Field(
        default=600.0,
        ge=0,
        description="a k tried at a batch cell is not tried there again for this long, "
        "even when a traffic shift has cleared what was measured of it",
    )
    oversold_for_s: float = Field(
        default=600.0,
        ge=0,
        description="a k pushed in on an estimate its own run then read slower is held to that "
        "run where it was pushed, while it does not run there, for this long (0: never)",
    )
    challenger_min_steps: float = Field(
        default=0.0,
        ge=0,
        description="a k with some live steps of its own at a batch cell, fewer than this, does "
        "not replace a running k that has this many there; the bursts go on measuring it (0: off)",
    )
    first_sight_from_prior: bool = Field(
        default=True,
        description=(
            "decide on first sight (and after a restart) from the profile's acceptance, "
            "without waiting for the first rebuild: a table running k=0 drafts almost nothing"
        ),
    )


class StepTimeSettings(_Group):
    enabled: bool = Field(
        default=True,
        description="decide from live step time T_hat (false: from the profile alone)",
    )
    prior_steps: float = Field(
        default=10.0, ge=0, description="w: weight of the profile's T in each cell, in steps"
    )
    half_life_s: float = Field(
        default=60.0, gt=0, description="live step-time sums fade with this half-life (seconds)"
    )
    prior_sigma: float = Field(
        default=0.01,
        ge=0,
        description="least relative uncertainty of the profile's T (its own spread if larger)",
    )
    correlation: float = Field(
        default=2.0, ge=1, description="steps per independent sample (neighbouring steps agree)"
    )
    shift: float = Field(
        # 0.15 read a change in 11 of 56 steady H200 parts (steps wander up to 60 % cycle to
        # cycle at B≈254); the recorded shape changes moved the running k by 76-183 %.
        default=0.4,
        gt=0,
        description=(
            "a running k's step time moving by more than this between cycles means the "
            "traffic changed: the other k of that batch cell are measured afresh"
        ),
    )
    settle_s: float = Field(
        default=15.0,
        ge=0,
        description=(
            "this many seconds after such a change, a k that ran the cell meanwhile and "
            "runs it no more is measured afresh: it was timed while the traffic settled; and "
            "after the cell's running k changed, no change of traffic is read (0: off)"
        ),
    )

    def blend_params(self) -> StepTimeParams:
        """How the estimate blends live data and the profile (the change checks apart)."""
        return StepTimeParams(**self.model_dump(exclude={"enabled", "shift", "settle_s"}))

    def feed(self, estimator: StepTimeEstimator, cells: StepCells, now: float) -> int:
        """One interval's step cells into ``estimator`` as the daemon adds them (fading, the
        shift check, settling); the replays of recorded runs add them the same way. Returns
        the cells outside its layout."""
        return estimator.add(cells, now, half_life_s=self.half_life_s, shift=self.shift,
                             correlation=self.correlation, settle_s=self.settle_s)  # fmt: skip


class PluginSettings(_Group):
    exploration_interval: int = Field(
        default=50, ge=0, description="plugin: one step at the longest K every N steps (0: off)"
    )
    hysteresis: int = Field(
        default=2, ge=0, description="plugin: keep k while the batch is within h of an edge"
    )
    neighbour_interval: int = Field(
        default=32,
        ge=0,
        description="plugin: a burst at a k next to the table's every N steps (live step time)",
    )
    # At least 2: the step drafting the burst's k and the one drafting the table's k again
    # are switch steps (the plugin's cells leave them out), so a burst of 1 times nothing.
    neighbour_burst: int = Field(
        default=4,
        ge=2,
        description=(
            "plugin: steps per neighbour burst (its last, and the step before it, are not timed)"
        ),
    )
    neighbour_recheck_interval: int = Field(
        default=128,
        ge=0,
        description=(
            "plugin: a burst every N steps instead when every k worth bursts is a long shot "
            "(measured worse where the load runs, kept in by its band as its estimate fades: "
            "a re-check), and while a rollback holds pushes for longer than the re-check "
            "wait; 0: at the neighbour interval"
        ),
    )
    neighbour_recheck_after_s: float = Field(
        default=120.0,
        ge=0,
        description=(
            "plugin: re-checks run at the re-check interval only once the replica's table has "
            "stood this long (a table just pushed may yet be wrong: its long shots are tried "
            "at the neighbour interval)"
        ),
    )
    exploration_cost_budget: float = Field(
        default=0.002,
        ge=0,
        lt=1,
        description=(
            "plugin: the acceptance exploration's step at K runs sparser where it costs (the "
            "table's k far below K at a batch whose K steps are slow), so that what it loses by "
            "the estimates stays under this share of the time (0: every EXPLORATION_INTERVAL)"
        ),
    )
    neighbour_cost_budget: float = Field(
        default=0.005,
        ge=0,
        lt=1,
        description=(
            "plugin: bursts at a measured k whose estimate loses to the table's run sparser, "
            "so that what they lose by the estimates stays under this share of the time "
            "(0: not priced)"
        ),
    )
    neighbour_directed: bool = Field(
        default=True,
        description=(
            "bursts only at the k that could beat the table's where the load runs (off when "
            "none could); false: at the adjacent k, always"
        ),
    )
    neighbour_drop_z: float = Field(
        default=1.0,
        ge=0,
        description=(
            "a k measured in bursts stops being explored when, taken this many standard errors "
            "faster than measured, it still loses to the table's k (larger: explored longer)"
        ),
    )


class AdminSettings(_Group):
    token: SecretStr | None = Field(
        default=None,
        description=(
            "admin API bearer token, the same variable as the plugin's (at least 16 characters: "
            "openssl rand -hex 32)"
        ),
    )
    token_file: Path | None = Field(
        default=None,
        description="file holding the token instead (a systemd credential, a Kubernetes secret)",
    )
    timeout_s: float = Field(default=5.0, gt=0, description="admin API timeout in seconds")
    refresh_s: float = Field(
        default=300.0, gt=0, description="re-read each replica's table at least this often"
    )
    retry_backoffs_s: Annotated[tuple[float, ...], NoDecode] = Field(
        default=(1.0, 1.0, 2.0, 3.0, 5.0),
        description="waits between push attempts on temporary errors (comma-separated)",
    )

    _split = field_validator("retry_backoffs_s", mode="before")(lambda cls, v: _split_list(v))


class GuardSettings(_Group):
    enabled: bool = Field(default=True, description="roll back pushes that lowered goodput")
    max_drop: float = Field(
        default=0.15, gt=0, lt=1, description="roll back when measured goodput drops more"
    )
    load_tolerance: float = Field(
        default=0.10, gt=0, description="samples compared when their loads differ by less"
    )
    window_s: float = Field(
        default=300.0, gt=0, description="seconds of goodput before/after a push compared"
    )
    min_samples: int = Field(
        default=3, ge=1, description="cycles at similar load needed on each side to judge"
    )
    cooldown_s: float = Field(
        default=900.0,
        ge=0,
        description="no new push for this long after a rollback, unless the traffic shifts "
        "after it (the rollback was judged on the old traffic)",
    )


class DriftSettings(_Group):
    acceptance_threshold: float = Field(
        default=0.15, gt=0, description="alert when some |a_hat_i - a_prior_i| exceeds this"
    )
    profile_threshold: float = Field(
        default=0.25,
        gt=0,
        description="alert when live step time / profile T at the same (B, k) is off by more",
    )
    min_steps: int = Field(
        default=100, ge=1, description="live steps a (k, batch) cell needs to be judged"
    )


class AlertSettings(_Group):
    alertmanager_url: str | None = Field(
        default=None, description="Alertmanager base URL (alerts are always logged)"
    )
    username: str | None = Field(default=None, description="Alertmanager basic-auth user")
    password: SecretStr | None = Field(default=None, description="Alertmanager basic-auth password")
    bearer_token: SecretStr | None = Field(default=None, description="Alertmanager bearer token")
    event_ttl_s: float = Field(
        default=900.0, gt=0, description="how long one-off alerts (shift, rollback) stay firing"
    )
    keep_events: int = Field(
        default=1000,
        ge=1,
        description="one-off alerts re-sent every cycle until they end (the newest kept)",
    )
    timeout_s: float = Field(default=5.0, gt=0, description="Alertmanager timeout in seconds")


class ServerSettings(_Group):
    host: str = Field(
        default="127.0.0.1",
        description="address of the daemon's /metrics, /healthz (0.0.0.0: every interface)",
    )
    port: int = Field(default=9465, ge=0, le=65535, description="port (0: no HTTP server)")


class StateSettings(_Group):
    dir: Path = Field(
        default=Path("/var/lib/tabletune"), description="where estimator state and tables live"
    )


class LogSettings(_Group):
    level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="log level"
    )
    format: Literal["json", "console"] = Field(default="json", description="log format")
