"""Scenario files: the engine as started, its load, its acceptance process and its faults.

YAML or JSON, validated on load; every error names the file and the field. A scenario is data
only: ``tabletune.sim.build`` turns it (with a profile) into a running emulated engine.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tabletune.errors import InputError
from tabletune.schemas.io import describe_validation_error
from tabletune.schemas.table import TableError, normalize_ranges

SCENARIO_KIND = "tabletune.sim-scenario"
PACKAGED = "tabletune.sim.scenarios"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def check_rates(rates: Sequence[float]) -> tuple[float, ...]:
    """a_1..a_K: each in [0, 1], non-increasing (a_i = all of the first i guesses accepted)."""
    values = tuple(float(a) for a in rates)
    if not values:
        raise ValueError("rates must hold at least one a_i")
    for i, a in enumerate(values, start=1):
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"a_{i}={a} is outside [0, 1]")
        if i > 1 and a > values[i - 2] + 1e-12:
            raise ValueError(
                f"rates must be non-increasing (a_{i}={a} > a_{i - 1}={values[i - 2]}): a_i is "
                "the chance that the first i guesses are ALL accepted"
            )
    return values


Rates = Annotated[tuple[float, ...], Field(min_length=1), AfterValidator(check_rates)]


class EngineSpec(_Model):
    """The emulated vLLM as it starts (and restarts)."""

    model_name: str = "qwen3-4b"
    engine_version: str = "0.26.0"
    engine_label: str = Field(default="0", description="vLLM's `engine` label value")
    num_speculative_tokens: int = Field(ge=1, description="K")
    max_num_seqs: int = Field(ge=1)
    starting_table: list[list[int]] | None = Field(
        description="num_speculative_tokens_per_batch_size; null = static k=K (no table)"
    )
    exploration_interval: int = Field(default=0, ge=0, description="applied at each start")
    hysteresis: int = Field(default=0, ge=0, description="applied at each start")
    admin_token: str | None = None

    @model_validator(mode="after")
    def _table(self) -> EngineSpec:
        if self.starting_table is not None:
            try:
                normalize_ranges(self.starting_table, max_k=self.num_speculative_tokens)
            except TableError as error:
                raise ValueError(f"starting_table: {error}") from None
        return self


# Loads: the number of running requests B(t). B above max_num_seqs waits (vLLM queues it).


class ConstantLoad(_Model):
    kind: Literal["constant"]
    batch_size: int = Field(ge=0)


class LoadStep(_Model):
    at_s: float = Field(ge=0)
    batch_size: int = Field(ge=0)


class StepsLoad(_Model):
    kind: Literal["steps"]
    steps: list[LoadStep] = Field(min_length=1, description="first at_s must be 0")

    @field_validator("steps")
    @classmethod
    def _ordered(cls, steps: list[LoadStep]) -> list[LoadStep]:
        if steps[0].at_s != 0:
            raise ValueError("the first step must be at_s: 0")
        for before, after in itertools.pairwise(steps):
            if after.at_s <= before.at_s:
                raise ValueError(f"at_s must increase ({after.at_s} after {before.at_s})")
        return steps


class SweepLoad(_Model):
    kind: Literal["sweep"]
    batch_sizes: list[int] = Field(min_length=1)
    dwell_s: float = Field(gt=0, description="time at each batch size")
    repeat: bool = True

    @field_validator("batch_sizes")
    @classmethod
    def _non_negative(cls, sizes: list[int]) -> list[int]:
        if any(b < 0 for b in sizes):
            raise ValueError("batch sizes must be >= 0")
        return sizes


class DiurnalLoad(_Model):
    kind: Literal["diurnal"]
    low: int = Field(ge=0)
    high: int = Field(ge=0)
    period_s: float = Field(gt=0)
    phase_s: float = 0.0
    resolution_s: float = Field(default=1.0, gt=0, description="B is re-read this often")

    @model_validator(mode="after")
    def _bounds(self) -> DiurnalLoad:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


class BurstsLoad(_Model):
    kind: Literal["bursts"]
    base: int = Field(ge=0)
    peak: int = Field(ge=0)
    every_s: float = Field(gt=0)
    length_s: float = Field(gt=0)
    start_s: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _fits(self) -> BurstsLoad:
        if self.length_s >= self.every_s:
            raise ValueError(f"length_s ({self.length_s}) must be < every_s ({self.every_s})")
        return self


class TraceLoad(_Model):
    kind: Literal["trace"]
    file: str = Field(
        description="CSV 'time_s,batch_size' or JSON [[t, B], ...]; relative to the scenario file"
    )
    repeat: bool = False


Load = Annotated[
    ConstantLoad | StepsLoad | SweepLoad | DiurnalLoad | BurstsLoad | TraceLoad,
    Field(discriminator="kind"),
]


# Acceptance processes a_i(t).


class ConstantAcceptance(_Model):
    kind: Literal["constant"]
    rates: Rates


class SwitchAcceptance(_Model):
    kind: Literal["switch"]
    before: Rates
    after: Rates
    at_s: float = Field(ge=0)


class DriftAcceptance(_Model):
    kind: Literal["drift"]
    start_rates: Rates
    end_rates: Rates
    start_s: float = Field(ge=0)
    end_s: float = Field(gt=0)
    resolution_s: float = Field(default=1.0, gt=0, description="rates are re-read this often")

    @model_validator(mode="after")
    def _order(self) -> DriftAcceptance:
        if self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be after start_s ({self.start_s})")
        if len(self.start_rates) != len(self.end_rates):
            raise ValueError("start_rates and end_rates must have the same length")
        return self


Acceptance = Annotated[
    ConstantAcceptance | SwitchAcceptance | DriftAcceptance, Field(discriminator="kind")
]


def acceptance_rate_sets(spec: Acceptance) -> list[tuple[float, ...]]:
    """Every rate vector an acceptance process is built from."""
    if isinstance(spec, ConstantAcceptance):
        return [spec.rates]
    if isinstance(spec, SwitchAcceptance):
        return [spec.before, spec.after]
    return [spec.start_rates, spec.end_rates]


# Faults, in simulated seconds.


class RestartFault(_Model):
    """vLLM restarts: counters reset, the starting table is back; down for ``downtime_s``."""

    kind: Literal["restart"]
    at_s: float = Field(ge=0)
    downtime_s: float = Field(default=0.0, ge=0)


class _Window(_Model):
    start_s: float = Field(ge=0)
    end_s: float = Field(gt=0)

    @model_validator(mode="after")
    def _order(self) -> _Window:
        if self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be after start_s ({self.start_s})")
        return self


class AdminErrorsFault(_Window):
    """The admin API answers ``status`` (5xx) to every request in the window."""

    kind: Literal["admin_errors"]
    status: int = Field(default=503, ge=500, le=599)


class AdminLatencyFault(_Window):
    """The admin API answers ``seconds`` (wall) late in the window."""

    kind: Literal["admin_latency"]
    seconds: float = Field(gt=0, le=600)


class MetricsOutageFault(_Window):
    """``/metrics`` answers 503 in the window."""

    kind: Literal["metrics_outage"]


class SlowScrapeFault(_Window):
    """``/metrics`` answers ``seconds`` (wall) late in the window."""

    kind: Literal["slow_scrape"]
    seconds: float = Field(gt=0, le=600)


Fault = Annotated[
    RestartFault | AdminErrorsFault | AdminLatencyFault | MetricsOutageFault | SlowScrapeFault,
    Field(discriminator="kind"),
]


class Scenario(_Model):
    """One emulated engine's life: how it starts, what load and acceptance it sees, what breaks."""

    schema_version: Literal[1] = 1
    kind: Literal["tabletune.sim-scenario"] = "tabletune.sim-scenario"
    name: str
    description: str = ""
    seed: int = 0
    profile: str | None = Field(
        default=None, description="profile JSON, relative to the scenario file (--profile wins)"
    )
    engine: EngineSpec
    load: Load
    acceptance: Acceptance
    step_noise: float = Field(default=0.0, ge=0, le=1, description="relative sd of step times")
    truth_interval_s: float = Field(default=10.0, gt=0)
    faults: list[Fault] = Field(default_factory=list)

    @model_validator(mode="after")
    def _rates_cover_k(self) -> Scenario:
        big_k = self.engine.num_speculative_tokens
        lengths = [len(rates) for rates in acceptance_rate_sets(self.acceptance)]
        if any(n != big_k for n in lengths):
            raise ValueError(
                f"acceptance: rates must hold exactly K={big_k} values "
                f"(engine.num_speculative_tokens), got {lengths}"
            )
        return self


def packaged_names() -> list[str]:
    """Scenario names shipped with TableTune (``--scenario NAME``)."""
    folder = resources.files(PACKAGED)
    return sorted(
        entry.name.rsplit(".", 1)[0]
        for entry in folder.iterdir()
        if entry.name.endswith((".yaml", ".yml"))
    )


def resolve(spec: str | Path) -> Path:
    """A path, or the name of a packaged scenario."""
    path = Path(spec)
    if path.exists():
        return path
    if isinstance(spec, str) and "/" not in spec and not path.suffix:
        candidate = Path(str(resources.files(PACKAGED).joinpath(f"{spec}.yaml")))
        if candidate.exists():
            return candidate
        raise InputError(
            f"{spec}: no such scenario file, and not a packaged scenario "
            f"(packaged: {', '.join(packaged_names())})"
        )
    raise InputError(f"{spec}: scenario file not found")


def parse_scenario(data: object, *, source: str) -> Scenario:
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping (a scenario), got {type(data).__name__}")
    found = data.get("kind")
    if found is not None and found != SCENARIO_KIND:
        raise InputError(f"{source}: kind: this is a {found!r} file, expected {SCENARIO_KIND!r}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as error:
        raise InputError(f"{source}: {describe_validation_error(error)}") from None


def load_scenario(spec: str | Path) -> tuple[Scenario, Path]:
    """The validated scenario and the folder its relative paths start from."""
    path = resolve(spec)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read: {error}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: not valid JSON: {error.msg} (line {error.lineno})") from None
    except yaml.YAMLError as error:
        raise InputError(f"{path}: not valid YAML: {error}") from None
    return parse_scenario(data, source=str(path)), path.parent
