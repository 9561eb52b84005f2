"""Faults an emulated engine can show: from the scenario (simulated-time windows) and set by
hand through the control endpoint (until cleared). Pure data and lookups."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from tabletune.sim import scenario as spec


class ManualFaults(BaseModel):
    """Faults set through ``/sim/v1/faults``; they hold until set back (null / 0 / false)."""

    model_config = ConfigDict(extra="forbid")

    admin_error_status: int | None = Field(default=None, ge=500, le=599)
    admin_latency_s: float = Field(default=0.0, ge=0, le=600)
    metrics_outage: bool = False
    metrics_delay_s: float = Field(default=0.0, ge=0, le=600)


class FaultsPatch(BaseModel):
    """Body of ``POST /sim/v1/faults``: only the fields given change."""

    model_config = ConfigDict(extra="forbid")

    admin_error_status: int | None = Field(default=None, ge=500, le=599)
    admin_latency_s: float | None = Field(default=None, ge=0, le=600)
    metrics_outage: bool | None = None
    metrics_delay_s: float | None = Field(default=None, ge=0, le=600)
    clear: bool = Field(default=False, description="reset every manual fault first")

    def apply(self, current: ManualFaults) -> ManualFaults:
        base = ManualFaults() if self.clear else current
        changes = self.model_dump(exclude_unset=True, exclude={"clear"})
        return base.model_copy(update=changes)


def _active(
    window: spec.AdminErrorsFault
    | spec.AdminLatencyFault
    | spec.MetricsOutageFault
    | spec.SlowScrapeFault,
    t: float,
) -> bool:
    return window.start_s <= t < window.end_s


@dataclass
class FaultPlan:
    """The scenario's faults plus the manual ones, asked by simulated time."""

    scheduled: Sequence[spec.Fault]
    manual: ManualFaults

    @classmethod
    def of(cls, faults: Sequence[spec.Fault]) -> FaultPlan:
        return cls(scheduled=tuple(faults), manual=ManualFaults())

    def restarts(self) -> list[spec.RestartFault]:
        found = [f for f in self.scheduled if isinstance(f, spec.RestartFault)]
        return sorted(found, key=lambda f: f.at_s)

    def admin_error(self, t: float) -> int | None:
        if self.manual.admin_error_status is not None:
            return self.manual.admin_error_status
        for fault in self.scheduled:
            if isinstance(fault, spec.AdminErrorsFault) and _active(fault, t):
                return fault.status
        return None

    def admin_latency_s(self, t: float) -> float:
        found = [
            f.seconds
            for f in self.scheduled
            if isinstance(f, spec.AdminLatencyFault) and _active(f, t)
        ]
        return max([self.manual.admin_latency_s, *found])

    def metrics_outage(self, t: float) -> bool:
        return self.manual.metrics_outage or any(
            isinstance(f, spec.MetricsOutageFault) and _active(f, t) for f in self.scheduled
        )

    def scrape_delay_s(self, t: float) -> float:
        found = [
            f.seconds
            for f in self.scheduled
            if isinstance(f, spec.SlowScrapeFault) and _active(f, t)
        ]
        return max([self.manual.metrics_delay_s, *found])
