"""Load B(t), acceptance a(t) and traffic shape as functions of simulated time, built from
scenario specs.

All are piecewise constant: ``at(t)`` is the value from ``t`` until ``next_change(t)`` (inf
when it never changes again), so the engine can run every step in between in one batch.
Continuous shapes (diurnal, drift) are re-read every ``resolution_s``.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from tabletune.errors import InputError
from tabletune.sim import scenario as spec
from tabletune.sim.serving import TrafficShape

INF = math.inf


class LoadProcess(Protocol):
    def at(self, t: float) -> int: ...

    def next_change(self, t: float) -> float: ...


class AcceptanceProcess(Protocol):
    def at(self, t: float) -> tuple[float, ...]: ...

    def next_change(self, t: float) -> float: ...


class TrafficProcess(Protocol):
    def at(self, t: float) -> TrafficShape: ...

    def next_change(self, t: float) -> float: ...


def _next_grid_point(t: float, step: float, origin: float = 0.0) -> float:
    return origin + (math.floor((t - origin) / step + 1e-9) + 1) * step


@dataclass(frozen=True)
class Piecewise:
    """A value that changes at given times: ``values[i]`` holds from ``times[i]``."""

    times: tuple[float, ...]
    values: tuple[int, ...]
    period_s: float | None = None  # repeat the whole pattern with this period

    def _index(self, t: float) -> tuple[int, float]:
        offset = 0.0
        if self.period_s is not None:
            offset = math.floor(t / self.period_s) * self.period_s
            t -= offset
        index = int(np.searchsorted(self.times, t, side="right")) - 1
        return max(index, 0), offset

    def at(self, t: float) -> int:
        return self.values[self._index(t)[0]]

    def next_change(self, t: float) -> float:
        index, offset = self._index(t)
        if index + 1 < len(self.times):
            return offset + self.times[index + 1]
        if self.period_s is not None:
            return offset + self.period_s
        return INF


@dataclass(frozen=True)
class Diurnal:
    low: int
    high: int
    period_s: float
    phase_s: float
    resolution_s: float

    def at(self, t: float) -> int:
        t = math.floor(t / self.resolution_s + 1e-9) * self.resolution_s
        wave = (1.0 - math.cos(2.0 * math.pi * (t + self.phase_s) / self.period_s)) / 2.0
        return round(self.low + (self.high - self.low) * wave)

    def next_change(self, t: float) -> float:
        return _next_grid_point(t, self.resolution_s)


@dataclass(frozen=True)
class Bursts:
    base: int
    peak: int
    every_s: float
    length_s: float
    start_s: float

    def at(self, t: float) -> int:
        if t < self.start_s:
            return self.base
        return self.peak if (t - self.start_s) % self.every_s < self.length_s else self.base

    def next_change(self, t: float) -> float:
        if t < self.start_s:
            return self.start_s
        cycle = math.floor((t - self.start_s) / self.every_s)
        begin = self.start_s + cycle * self.every_s
        return begin + self.length_s if t < begin + self.length_s else begin + self.every_s


def read_trace(path: Path) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """A trace file: CSV lines ``time_s,batch_size`` (a header line is allowed) or JSON
    ``[[time_s, batch_size], ...]``; times start at 0 and increase."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read the load trace: {error}") from None
    rows: list[tuple[float, int]] = []
    try:
        if path.suffix == ".json":
            rows = [(float(t), int(b)) for t, b in json.loads(text)]
        else:
            for number, line in enumerate(text.splitlines(), start=1):
                cells = [c.strip() for c in line.split(",")]
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                try:
                    rows.append((float(cells[0]), int(cells[1])))
                except (ValueError, IndexError):
                    if number == 1:
                        continue  # a header
                    raise InputError(
                        f"{path}: line {number}: expected 'time_s,batch_size', got {line!r}"
                    ) from None
    except (ValueError, TypeError) as error:
        raise InputError(f"{path}: expected [[time_s, batch_size], ...]: {error}") from None
    if not rows:
        raise InputError(f"{path}: the load trace is empty")
    if rows[0][0] != 0:
        raise InputError(f"{path}: the trace must start at time 0 (starts at {rows[0][0]})")
    for (t0, _), (t1, _) in itertools.pairwise(rows):
        if t1 <= t0:
            raise InputError(f"{path}: times must increase ({t1} after {t0})")
    if any(b < 0 for _, b in rows):
        raise InputError(f"{path}: batch sizes must be >= 0")
    return tuple(t for t, _ in rows), tuple(b for _, b in rows)


def build_load(load: spec.Load, base_dir: Path) -> LoadProcess:
    if isinstance(load, spec.ConstantLoad):
        return Piecewise(times=(0.0,), values=(load.batch_size,))
    if isinstance(load, spec.StepsLoad):
        return Piecewise(
            times=tuple(s.at_s for s in load.steps), values=tuple(s.batch_size for s in load.steps)
        )
    if isinstance(load, spec.SweepLoad):
        count = len(load.batch_sizes)
        return Piecewise(
            times=tuple(i * load.dwell_s for i in range(count)),
            values=tuple(load.batch_sizes),
            period_s=count * load.dwell_s if load.repeat else None,
        )
    if isinstance(load, spec.DiurnalLoad):
        return Diurnal(load.low, load.high, load.period_s, load.phase_s, load.resolution_s)
    if isinstance(load, spec.BurstsLoad):
        return Bursts(load.base, load.peak, load.every_s, load.length_s, load.start_s)
    path = Path(load.file)
    times, values = read_trace(path if path.is_absolute() else base_dir / path)
    period = None
    if load.repeat:
        step = times[-1] - times[-2] if len(times) > 1 else 1.0
        period = times[-1] + step  # the last value holds as long as the step before it
    return Piecewise(times=times, values=values, period_s=period)


@dataclass(frozen=True)
class ConstantRates:
    rates: tuple[float, ...]

    def at(self, t: float) -> tuple[float, ...]:
        return self.rates

    def next_change(self, t: float) -> float:
        return INF


@dataclass(frozen=True)
class SwitchRates:
    before: AcceptanceProcess
    after: tuple[float, ...]
    at_s: float

    def at(self, t: float) -> tuple[float, ...]:
        return self.before.at(t) if t < self.at_s else self.after

    def next_change(self, t: float) -> float:
        return min(self.before.next_change(t), self.at_s) if t < self.at_s else INF


@dataclass(frozen=True)
class DriftRates:
    start: tuple[float, ...]
    end: tuple[float, ...]
    start_s: float
    end_s: float
    resolution_s: float
    _span: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_span", self.end_s - self.start_s)

    def at(self, t: float) -> tuple[float, ...]:
        if t <= self.start_s:
            return self.start
        if t >= self.end_s:
            return self.end
        steps = math.floor((t - self.start_s) / self.resolution_s + 1e-9)
        w = min(1.0, steps * self.resolution_s / self._span)
        # A mix of two non-increasing vectors is non-increasing: a stays a valid a_i.
        return tuple((1 - w) * a + w * b for a, b in zip(self.start, self.end, strict=True))

    def next_change(self, t: float) -> float:
        if t < self.start_s:
            return self.start_s
        if t >= self.end_s:
            return INF
        return min(self.end_s, _next_grid_point(t, self.resolution_s, self.start_s))


def build_acceptance(acceptance: spec.Acceptance) -> AcceptanceProcess:
    if isinstance(acceptance, spec.ConstantAcceptance):
        return ConstantRates(acceptance.rates)
    if isinstance(acceptance, spec.SwitchAcceptance):
        return SwitchRates(ConstantRates(acceptance.before), acceptance.after, acceptance.at_s)
    return DriftRates(
        acceptance.start_rates,
        acceptance.end_rates,
        acceptance.start_s,
        acceptance.end_s,
        acceptance.resolution_s,
    )


@dataclass(frozen=True)
class LoadOverride:
    """A load set by hand from ``at_s`` on (the control endpoint); before it, the old one."""

    before: LoadProcess
    batch_size: int
    at_s: float

    def at(self, t: float) -> int:
        return self.before.at(t) if t < self.at_s else self.batch_size

    def next_change(self, t: float) -> float:
        return min(self.before.next_change(t), self.at_s) if t < self.at_s else INF


@dataclass(frozen=True)
class ShapeSwitch:
    """Traffic of one shape until ``at_s`` (never, for constant traffic), then another."""

    before: TrafficShape
    after: TrafficShape
    at_s: float = INF

    def at(self, t: float) -> TrafficShape:
        return self.before if t < self.at_s else self.after

    def next_change(self, t: float) -> float:
        return self.at_s if t < self.at_s else INF


def build_traffic(traffic: spec.Traffic) -> TrafficProcess:
    if isinstance(traffic, spec.ConstantTraffic):
        shape = traffic.shape.shape()
        return ShapeSwitch(shape, shape)
    return ShapeSwitch(traffic.before.shape(), traffic.after.shape(), traffic.at_s)
