"""Where the plugin's neighbour bursts should go, pure: the allowed k that could still beat
the table's k where the load runs.

A k is worth exploring at a loaded batch size when its optimistic goodput beats the table's k
there: measured (``MEASURED_STEPS`` live steps since the cell's traffic last changed, faded
or not), its step time ``z`` uncertainty bands faster than estimated (``neighbour_drop_z``,
1; docs/daemon.md says what 2 did on the H200's recorded cells and on the emulator); never
measured there, what the profile promises (with ``DECISION__CHALLENGER_MIN_STEPS`` on and a
few live steps already, the better of that and what those steps hope for: the decision does
not put such a k in before it is measured, so the bursts must go on until it is). A k that
live steps have shown to be worse drops out, and stays out while the traffic there stays as
it was, so the bursts stop paying for it; a k the table
cannot reach by small steps (k=3 running where k=1 is best) is still tried. With nothing
worth trying the daemon turns the bursts off. A measured k kept in only by its band (its
estimate loses, its optimistic bound does not: a faded estimate's re-check) is a long shot;
when every k worth bursts is one, they run sparser (``PLUGIN__NEIGHBOUR_RECHECK_INTERVAL``),
and so do all bursts while a rollback holds pushes for longer than a re-check waits
(``sparse_bursts``).
Bursts at a measured k whose estimate loses are priced: spaced so that what they lose, by the
estimates, stays under ``PLUGIN__NEIGHBOUR_COST_BUDGET`` of the time (``priced_spacing``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple

from tabletune.admin.protocol import TableView
from tabletune.daemon.guard import view_ranges
from tabletune.daemon.runtime import ReplicaRuntime
from tabletune.daemon.settings import DaemonSettings
from tabletune.daemon.step_time import MEASURED_STEPS, StepTimeEstimate
from tabletune.solver import StepTimes, dense_lookup, tau
from tabletune.step_cells import cell_of


def loaded_batches(load_weights: Mapping[int, float], *, min_share: float) -> list[int]:
    """Batch sizes holding at least ``min_share`` of the load (the heaviest one always)."""
    total = sum(load_weights.values())
    if total <= 0:
        return []
    heaviest = max(load_weights, key=lambda b: load_weights[b])
    return sorted({heaviest} | {b for b, w in load_weights.items() if w / total >= min_share})


class Exploration(NamedTuple):
    """The k worth bursts (sorted; empty: none), and those of them that are long shots: at
    every loaded batch size where chosen, measured and kept in by their band alone. What a
    burst step costs, averaged over the k (the bursts take them in turn), in steps of the
    table's k: its time (``step_time``) and the goodput it gives up against the table's k by
    the point estimates (``step_loss``; nothing for an unmeasured k or one whose estimate wins,
    the most where chosen at several batch sizes)."""

    ks: tuple[int, ...]
    long_shots: tuple[int, ...] = ()
    step_time: float = 1.0
    step_loss: float = 0.0

    @property
    def rechecks_only(self) -> bool:
        return bool(self.ks) and self.long_shots == self.ks


def directed_exploration(
    estimate: StepTimeEstimate,
    profile: StepTimes,
    rates: Sequence[float],
    table_lookup: Sequence[int],
    load_weights: Mapping[int, float],
    allowed_k: Collection[int],
    *,
    min_steps: float,
    z: float,
    min_share: float = 0.05,
    hope_from_few_steps: bool = False,
) -> Exploration:
    """The k bursts should run, and the long shots among them. ``table_lookup[B]`` is the
    table's k at batch size B (vLLM's dense form, index 0 unused). ``hope_from_few_steps``: a
    k not yet measured but with live steps is also tried on what they hope for (the decision
    waits for its measurement: ``DECISION__CHALLENGER_MIN_STEPS``)."""
    top = min(estimate.step_times.max_batch, len(table_lookup) - 1)
    column = {cell: j for j, cell in enumerate(estimate.cells)}
    rows = {k: i for i, k in enumerate(estimate.ks)}
    chosen: set[int] = set()
    more_than_long_shot: set[int] = set()  # somewhere unmeasured, or its estimate wins
    cost: dict[int, tuple[float, float]] = {}  # k -> (step time, step loss), table-k steps
    for batch in loaded_batches(load_weights, min_share=min_share):
        b = min(max(1, batch), top)
        current = table_lookup[b]
        if current not in rows:
            continue
        estimated = estimate.step_times.at(b, current)
        best = b * tau(rates, current) / estimated
        j = column[cell_of(b)]
        for k in allowed_k:
            if k == current or k not in rows:
                continue
            i = rows[k]
            own = estimate.measured[i, j]
            measured = own >= min_steps
            if measured:
                point = estimate.step_times.at(b, k)
                hopeful = point * (1.0 - z * float(estimate.relative_sigma[i, b - 1]))
            else:
                point = hopeful = profile.at(b, k)
                if hope_from_few_steps and own > 0:  # what those steps hope for too
                    live = estimate.step_times.at(b, k)
                    sigma = float(estimate.relative_sigma[i, b - 1])
                    hopeful = min(hopeful, live * (1.0 - z * sigma))
            tokens = b * tau(rates, k)
            if hopeful > 0 and tokens / hopeful > best:
                chosen.add(k)
                if not measured or tokens / point > best:
                    more_than_long_shot.add(k)
                time = point / estimated
                loss = max(0.0, time * (1.0 - tokens / point / best)) if measured else 0.0
                if k not in cost or loss > cost[k][1]:
                    cost[k] = (time, loss)
    ks = tuple(sorted(chosen))
    return Exploration(
        ks,
        tuple(k for k in ks if k not in more_than_long_shot),
        step_time=sum(cost[k][0] for k in ks) / len(ks) if ks else 1.0,
        step_loss=sum(cost[k][1] for k in ks) / len(ks) if ks else 0.0,
    )


def priced_spacing(exploration: Exploration, *, burst: int, budget: float) -> int:
    """The fewest steps from one burst's start to the next (the plugin's neighbour interval:
    ``burst`` of them at an explored k, priced by ``exploration``, the rest at the table's k)
    that keep the bursts' loss within ``budget`` of the time; 0: no bound (nothing priced, or
    no budget). In time of the table's k's steps: burst * step_loss over
    (spacing - burst) + burst * step_time."""
    if budget <= 0 or exploration.step_loss <= 0:
        return 0
    lost = burst * exploration.step_loss
    return max(0, math.ceil(lost / budget + burst * (1.0 - exploration.step_time)))


def acceptance_step_loss(
    step_times: StepTimes,
    rates: Sequence[float],
    table_lookup: Sequence[int],
    load_weights: Mapping[int, float],
    big_k: int,
    *,
    min_share: float = 0.05,
) -> float:
    """What one acceptance-exploration step costs by the estimates, in steps of the table's k,
    weighed over the loaded batch sizes. The plugin reads K for it: that step drafts K and
    takes K's step time while it keeps the table's k's tokens; the next verifies K in about a
    step of the table's k and keeps tau(K). So per exploration (T(K) - T(k)) / T(k) steps are
    spent and (tau(K) - tau(k)) / tau(k) steps' worth gained; none where that is a gain, or
    where the table runs K. On an H200 at decode-heavy B≈254 (k=0 the table's, K=3: 41.6 and
    14.0 ms, tau 2.7 and 1) about 0.27 a step; priced by the step trace, one every 50 steps
    cost about 0.7 % of the time (docs/results.md, "At 82db989")."""
    top = min(step_times.max_batch, len(table_lookup) - 1)
    weights: dict[int, float] = {}
    for b in loaded_batches(load_weights, min_share=min_share):
        at = min(max(1, b), top)
        weights[at] = weights.get(at, 0.0) + load_weights[b]
    total = sum(weights.values())
    if total <= 0 or big_k not in step_times.ks or big_k > len(rates):
        return 0.0
    loss = 0.0
    for b, weight in weights.items():
        k = table_lookup[b]
        if k >= big_k or k not in step_times.ks:
            continue
        spent = step_times.at(b, big_k) / step_times.at(b, k) - 1.0
        gained = tau(rates, big_k) / tau(rates, k) - 1.0
        loss += weight / total * max(0.0, spent - gained)
    return loss


def acceptance_spacing(loss: float, *, budget: float) -> int:
    """The fewest steps between acceptance-exploration steps that keep ``loss`` a step within
    ``budget`` of the time; 0: no bound (nothing lost, or no budget)."""
    if budget <= 0 or loss <= 0:
        return 0
    return math.ceil(loss / budget)


def sparse_bursts(
    exploration: Exploration, *, table_stood: bool, hold_left_s: float, recheck_after_s: float
) -> bool:
    """Bursts run at the re-check interval: they only re-check long shots of a table that has
    stood ``recheck_after_s``, or a rollback holds pushes for longer than that, so nothing
    they find can be pushed before then (at B≈254 on the H200 bursts read k=1 and k=3 ahead
    of k=0's run, and ran every 32 steps through the hold, 18 % of the time)."""
    if not exploration.ks:
        return False
    return (exploration.rechecks_only and table_stood) or hold_left_s > recheck_after_s


def table_and_load(
    rt: ReplicaRuntime, view: TableView, max_batch: int
) -> tuple[list[int], dict[int, float]] | None:
    """The replica's table as vLLM reads it (dense, index = batch size) and its load weights,
    both up to the batch sizes its engine and the step times cover; None: no table."""
    ranges = view_ranges(view)
    if ranges is None:
        return None
    top = min(view.max_num_seqs, max_batch)
    return dense_lookup(ranges, top, view.num_speculative_tokens), rt.loads.clipped(top)


def replica_acceptance_spacing(
    rt: ReplicaRuntime,
    view: TableView,
    step_times: StepTimes,
    rates: Sequence[float],
    settings: DaemonSettings,
) -> int:
    """The fewest steps between this replica's acceptance-exploration steps their price allows
    (0: any)."""
    table = table_and_load(rt, view, step_times.max_batch)
    if table is None or not view.allowed_k:
        return 0
    loss = acceptance_step_loss(
        step_times,
        rates,
        *table,
        max(view.allowed_k),  # the k the plugin's exploration steps run
    )
    return acceptance_spacing(loss, budget=settings.plugin.exploration_cost_budget)


def replica_exploration(
    rt: ReplicaRuntime,
    view: TableView,
    estimate: StepTimeEstimate,
    rates: Sequence[float],
    settings: DaemonSettings,
) -> Exploration | None:
    """The k worth neighbour bursts on this replica (None: the plugin's adjacent k)."""
    table = table_and_load(rt, view, rt.pool.step_times.max_batch)
    if not settings.plugin.neighbour_directed or table is None:
        return None
    return directed_exploration(
        estimate,
        rt.pool.step_times,
        rates,
        *table,
        set(view.allowed_k) & set(rt.pool.step_times.ks),
        min_steps=MEASURED_STEPS,
        z=settings.plugin.neighbour_drop_z,
        hope_from_few_steps=settings.decision.challenger_min_steps > 0,
    )
