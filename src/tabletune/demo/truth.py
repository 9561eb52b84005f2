"""What the emulator's ground truth says each cycle (never the daemon's own view), and the
summary line. Pure: from the truth JSON and the profile's step times."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tabletune.solver import SolverError, StepTimes, evaluate_table

CONVERGED_LOSS = 0.015
"""a table within 1.5 % of the oracle at every load counts as repaired"""


@dataclass(frozen=True)
class Interval:
    """One of the emulator's ground-truth intervals (10 simulated seconds by default)."""

    start_s: float
    end_s: float
    tokens: float
    """generated tokens"""
    oracle_tokens: float
    """what the oracle's k would have kept over the same busy time"""


@dataclass
class Timeline:
    """One entry per daemon cycle, for the live view, the summary and the PNG."""

    sim_s: list[float] = field(default_factory=list)
    load: list[int] = field(default_factory=list)
    worst_loss: list[float | None] = field(default_factory=list)
    efficiency: list[float | None] = field(default_factory=list)
    """the emulator's last 10 s: goodput of the k that ran / the oracle's"""
    estimate: list[tuple[float, ...]] = field(default_factory=list)
    truth: list[tuple[float, ...]] = field(default_factory=list)
    pushes: list[float] = field(default_factory=list)
    first_converged_s: float | None = None
    starting_worst: dict[str, Any] | None = None
    """the starting table's worst load and loss"""
    intervals: dict[float, Interval] = field(default_factory=dict)
    """the emulator's intervals seen, by start time (cycles and intervals need not line up)"""
    starting_table: list[list[int]] | None = None
    kept_share: list[float] = field(default_factory=list)
    """model goodput / oracle at the running load each cycle, had the starting table stayed"""
    ours_share: list[float] = field(default_factory=list)
    """the same for the table that runs"""


def goodput_at(
    step_times: StepTimes, rates: list[float], table: list[list[int]], batch: int
) -> float:
    """Model goodput (tokens/ms) of ``table`` at batch size ``batch``."""
    return evaluate_table(
        step_times, rates, [(r[0], r[1], r[2]) for r in table], max_batch=batch, max_k=len(rates)
    ).goodput[batch - 1]


def last_efficiency(truth: dict[str, Any]) -> float | None:
    intervals = truth.get("intervals") or []
    if not intervals:
        return None
    value = intervals[-1].get("efficiency")
    return float(value) if value is not None else None


def loss_vs_oracle(truth: dict[str, Any], step_times: StepTimes) -> dict[str, Any] | None:
    """Worst load of the running table against the oracle table (true a_i, captured k only)."""
    if truth.get("table") is None or not truth.get("rates"):
        return None
    top = min(step_times.max_batch, max(r[1] for r in truth["oracle_table"]))
    try:
        ran, best = (
            evaluate_table(
                step_times,
                truth["rates"],
                [tuple(r) for r in table],
                max_batch=top,
                max_k=len(truth["rates"]),
            ).goodput
            for table in (truth["table"], truth["oracle_table"])
        )
    except SolverError:
        return None
    losses = [1.0 - r / o for r, o in zip(ran, best, strict=True)]
    worst = max(range(len(losses)), key=losses.__getitem__)
    return {"loss": losses[worst], "batch_size": worst + 1}


def record(
    truth: dict[str, Any],
    estimate: tuple[float, ...],
    timeline: Timeline,
    step_times: StepTimes,
    *,
    pushed: bool,
) -> None:
    """Add one cycle: ``truth`` from ``/sim/v1/truth``, the daemon's a_hat, whether it pushed."""
    sim_s = float(truth["sim_time_s"])
    if pushed:
        timeline.pushes.append(sim_s)
    loss_info = loss_vs_oracle(truth, step_times) or {}
    truth["loss_vs_oracle"] = loss_info
    _counterfactual(truth, step_times, timeline)
    loss = loss_info.get("loss")
    if timeline.starting_worst is None and loss_info:
        timeline.starting_worst = dict(loss_info)
    timeline.sim_s.append(sim_s)
    timeline.load.append(int((truth.get("current") or {}).get("batch_size", 0)))
    timeline.worst_loss.append(loss)
    timeline.efficiency.append(last_efficiency(truth))
    timeline.estimate.append(estimate)
    timeline.truth.append(tuple(truth.get("rates", ())))
    converged = loss is not None and loss <= CONVERGED_LOSS
    if converged and timeline.first_converged_s is None:
        timeline.first_converged_s = sim_s
    if not converged:
        timeline.first_converged_s = None  # must stay within 1.5 % once reached
    for seen in truth.get("intervals") or []:
        interval = Interval(
            start_s=float(seen["start_s"]),
            end_s=float(seen["end_s"]),
            tokens=float(seen["tokens"]),
            oracle_tokens=float(seen["oracle_tokens"]),
        )
        timeline.intervals[interval.start_s] = interval


def _counterfactual(truth: dict[str, Any], step_times: StepTimes, timeline: Timeline) -> None:
    """What the starting table would give at this load, next to what runs now (the model)."""
    if timeline.starting_table is None:
        timeline.starting_table = truth.get("table")
    batch = int((truth.get("current") or {}).get("batch_size", 0))
    rates = truth.get("rates")
    if not batch or not rates or truth.get("table") is None or timeline.starting_table is None:
        return
    batch = min(batch, step_times.max_batch)
    try:
        oracle = goodput_at(step_times, rates, truth["oracle_table"], batch)
        timeline.kept_share.append(
            goodput_at(step_times, rates, timeline.starting_table, batch) / oracle
        )
        timeline.ours_share.append(goodput_at(step_times, rates, truth["table"], batch) / oracle)
    except SolverError:
        return


def share(intervals: list[Interval]) -> float | None:
    """Measured goodput over the intervals as a share of the oracle's."""
    oracle = sum(i.oracle_tokens for i in intervals)
    return sum(i.tokens for i in intervals) / oracle if oracle > 0 else None


def measured_around_first_push(timeline: Timeline) -> tuple[float | None, float | None]:
    """The share of the oracle's goodput in the intervals that ended before the first push and
    in those that started after it (an interval the push falls into counts in neither)."""
    seen = list(timeline.intervals.values())
    if not timeline.pushes:
        return share(seen), None
    first = timeline.pushes[0]
    return (
        share([i for i in seen if i.end_s <= first]),
        share([i for i in seen if i.start_s >= first]),
    )


def summary(timeline: Timeline) -> str:
    parts = [f"demo: {len(timeline.pushes)} push(es)"]
    if timeline.starting_worst:
        worst = timeline.starting_worst
        parts.append(
            f"starting table lost {worst['loss']:.1%} of the goodput at B={worst['batch_size']}"
        )
    parts.append(
        "table within 1.5 % of the oracle at every load from "
        + (
            f"t={timeline.first_converged_s:.0f} s"
            if timeline.first_converged_s is not None
            else "never"
        )
    )
    if timeline.ours_share:
        kept = sum(timeline.kept_share) / len(timeline.kept_share)
        ours = sum(timeline.ours_share) / len(timeline.ours_share)
        parts.append(
            f"at the loads seen, the starting table would give {kept:.1%} of the oracle's "
            f"goodput, the daemon's tables {ours:.1%} (model)"
        )
    before, after = measured_around_first_push(timeline)
    shown = []
    if before is not None:
        shown.append(
            f"{before:.1%} of the oracle" + (" before the first push" if timeline.pushes else "")
        )
    if after is not None:
        shown.append(
            f"{after:.1%} after" if shown else f"{after:.1%} of the oracle after the first push"
        )
    if shown:
        parts.append(
            "measured by the emulator: "
            + ", ".join(shown)
            + " (the plugin's exploration steps included)"
        )
    return "; ".join(parts)
