"""Scenario files: the engine as started, its load, its acceptance process and its faults.

YAML or JSON, validated on load; every error names the file and the field. A scenario is data
only: ``tabletune.sim.build`` turns it (with a profile) into a running emulated engine.
"""

from __future__ import annotations

import functools
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
    ValidationInfo,
    field_validator,
    model_validator,
)

from tabletune.admin.protocol import EngineIdentity
from tabletune.errors import InputError
from tabletune.schemas.io import describe_validation_error
from tabletune.schemas.table import TableError, normalize_ranges
from tabletune.sim.serving import Lengths, ServingModel, TrafficShape

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
    tensor_parallel_size: int = Field(default=1, ge=1, description="reported in the table view")
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

    def identity(self) -> EngineIdentity:
        """The emulated engine's identity, as the plugin's table view reports it."""
        return EngineIdentity(self.engine_version, self.model_name, self.tensor_parallel_size)


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


# The serving model: traffic shapes (prompt and output lengths) and what they do to step times.

MAX_LENGTH_TOKENS = 131_072  # bounds the length tables (a pmf over 1..max)


class ConstantLengths(_Model):
    kind: Literal["constant"]
    tokens: int = Field(ge=1, le=MAX_LENGTH_TOKENS)

    def lengths(self) -> Lengths:
        return Lengths.constant(self.tokens)


class UniformLengths(_Model):
    """Every whole number of tokens in low..high equally likely."""

    kind: Literal["uniform"]
    low: int = Field(ge=1)
    high: int = Field(le=MAX_LENGTH_TOKENS)

    @model_validator(mode="after")
    def _order(self) -> UniformLengths:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self

    def lengths(self) -> Lengths:
        return Lengths.uniform(self.low, self.high)


class LognormalLengths(_Model):
    """exp(N(ln median, sigma^2)) rounded to whole tokens and clipped to 1..max."""

    kind: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(gt=0, le=4)
    max: int = Field(ge=1, le=MAX_LENGTH_TOKENS, description="longer draws are cut to this")

    @model_validator(mode="after")
    def _median_fits(self) -> LognormalLengths:
        if self.median > self.max:
            raise ValueError(f"median ({self.median}) must be <= max ({self.max})")
        return self

    def lengths(self) -> Lengths:
        return Lengths.lognormal(self.median, self.sigma, self.max)


LengthSpec = Annotated[
    ConstantLengths | UniformLengths | LognormalLengths, Field(discriminator="kind")
]


class TrafficShapeSpec(_Model):
    """Requests of one kind of traffic: prompt and output lengths in tokens (independent)."""

    name: str = ""
    prompt: LengthSpec
    output: LengthSpec

    def shape(self) -> TrafficShape:
        """The shape's maths; one object per distinct spec, shared by every replica (its
        tables take memory and time to build)."""
        return _shape_of(self)


@functools.lru_cache(maxsize=64)
def _shape_of(spec: TrafficShapeSpec) -> TrafficShape:
    return TrafficShape(spec.name, spec.prompt.lengths(), spec.output.lengths())


class ConstantTraffic(_Model):
    kind: Literal["constant"]
    shape: TrafficShapeSpec


class SwitchTraffic(_Model):
    """One shape until ``at_s``, another from then on (e.g. decode-heavy -> prefill-heavy)."""

    kind: Literal["switch"]
    before: TrafficShapeSpec
    after: TrafficShapeSpec
    at_s: float = Field(ge=0)


Traffic = Annotated[ConstantTraffic | SwitchTraffic, Field(discriminator="kind")]


def traffic_shapes(spec: Traffic) -> list[TrafficShapeSpec]:
    """Every shape a traffic process is built from."""
    return [spec.shape] if isinstance(spec, ConstantTraffic) else [spec.before, spec.after]


class ServingSpec(_Model):
    """Step times under serving traffic (``tabletune.sim.serving``); absent: the profile's."""

    traffic: Traffic
    graph_limit_tokens: int = Field(
        default=512, ge=1, le=2048, description="largest captured CUDA-graph size, in tokens"
    )
    graph_miss_factor: float = Field(
        default=1.8, ge=1, le=10, description="step time x this above the graph limit"
    )
    graph_misses_in_profile: bool = Field(
        default=False,
        description="the profile already holds pure-decode misses (B(1+k) > limit): a real one",
    )
    prefill_us_per_token: float = Field(default=8.0, ge=0, le=1000)
    context_cost: float = Field(default=0.0, ge=0, le=10, description="per context_ref_tokens")
    context_ref_tokens: float = Field(default=1024.0, gt=0)
    max_num_batched_tokens: int = Field(default=8192, ge=1)
    attention_us_per_context_token: float = Field(
        default=0.0, ge=0, le=1, description="per decoding request, a step, at every k"
    )

    @model_validator(mode="after")
    def _limit_fits_budget(self) -> ServingSpec:
        if self.graph_limit_tokens > self.max_num_batched_tokens:
            raise ValueError(
                f"graph_limit_tokens ({self.graph_limit_tokens}) must be <= "
                f"max_num_batched_tokens ({self.max_num_batched_tokens})"
            )
        return self

    def model(self) -> ServingModel:
        return ServingModel(
            graph_limit_tokens=self.graph_limit_tokens,
            graph_miss_factor=self.graph_miss_factor,
            graph_misses_in_profile=self.graph_misses_in_profile,
            prefill_s_per_token=self.prefill_us_per_token * 1e-6,
            context_cost=self.context_cost,
            context_ref_tokens=self.context_ref_tokens,
            max_num_batched_tokens=self.max_num_batched_tokens,
            attention_s_per_context_token=self.attention_us_per_context_token * 1e-6,
        )


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
    serving: ServingSpec | None = Field(
        default=None, description="serving traffic model; absent: step time = the profile's"
    )

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

    @field_validator("serving")
    @classmethod
    def _prefill_fits(cls, serving: ServingSpec | None, info: ValidationInfo) -> ServingSpec | None:
        engine = info.data.get("engine")  # absent when the engine section was invalid
        if serving is not None and isinstance(engine, EngineSpec):
            _check_prefill_fits(serving, engine)
        return serving


def _check_prefill_fits(serving: ServingSpec, engine: EngineSpec) -> None:
    """At the heaviest load (B = max_num_seqs, k = K, every draft kept) the prompts arriving per
    step must fit the token budget left beside the decode tokens, or prefill would fall behind
    for good (the engine would be prefill-bound and B no longer its decode batch)."""
    model = serving.model()
    decode = engine.max_num_seqs * (1 + engine.num_speculative_tokens)
    if model.prefill_budget(decode) <= 0:
        raise ValueError(
            f"max_num_batched_tokens ({serving.max_num_batched_tokens}) leaves no room "
            f"for prefill beside max_num_seqs x (1 + K) = {decode} decode tokens"
        )
    for spec in traffic_shapes(serving.traffic):
        share = model.worst_prefill_share(
            engine.max_num_seqs, engine.num_speculative_tokens, spec.shape()
        )
        if share >= 1.0:
            raise ValueError(
                f"traffic: shape {spec.name or '(unnamed)'!r} needs "
                f"{share:.0%} of the prefill budget at B=max_num_seqs, k=K: prefill would fall "
                "behind for good; use shorter prompts, longer outputs or a larger "
                "max_num_batched_tokens"
            )


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
