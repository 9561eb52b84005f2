"""The daemon's watch over its estimates: a_hat and T_hat against the profile, as metrics and
as condition alerts (the profile no longer describes what the replicas serve)."""

from __future__ import annotations

from dataclasses import dataclass

from tabletune.daemon import alerts as names
from tabletune.daemon.alerts import Alert, AlertSink
from tabletune.daemon.drift import acceptance_gap, step_drifts
from tabletune.daemon.estimation import UnitEstimator
from tabletune.daemon.metrics import DaemonMetrics
from tabletune.daemon.profiles import PoolProfile
from tabletune.daemon.runtime import ReplicaRuntime
from tabletune.daemon.settings import DaemonSettings
from tabletune.schemas.shape import profile_shape_mismatch
from tabletune.step_cells import StepCells, cell_label


@dataclass
class Checks:
    settings: DaemonSettings
    metrics: DaemonMetrics
    alerts: AlertSink

    def acceptance(
        self,
        key: str,
        pool: PoolProfile,
        unit: UnitEstimator,
        now: float,
        checked: set[tuple[str, str]],
    ) -> None:
        for i, (rate, prior) in enumerate(zip(unit.rates, pool.prior, strict=True), start=1):
            self.metrics.acceptance.labels(key, str(i)).set(rate)
            self.metrics.acceptance_prior.labels(key, str(i)).set(prior)
        by_replica = self.settings.estimator.scope == "replica"
        replica, pool_label = (key, pool.name) if by_replica else ("", key)
        checked.add((replica, "") if by_replica else ("", pool_label))
        position, gap = acceptance_gap(unit.rates, pool.prior)
        if abs(gap) > self.settings.drift.acceptance_threshold:
            self.alerts.condition(
                Alert(
                    names.ACCEPTANCE_DRIFT,
                    f"acceptance moved away from the prior at position {position}",
                    f"a_hat_{position} - a_prior_{position} = {gap:+.3f}; a_hat="
                    f"{[round(r, 3) for r in unit.rates]}, prior={list(pool.prior)}",
                    replica=replica,
                    pool=pool_label,
                ),
                now,
            )

    def step_time(self, rt: ReplicaRuntime, cells: StepCells, now: float) -> None:
        self._step_drift(rt, cells, now)
        self._traffic_shape(rt, cells, now)

    def profile_setup(self, rt: ReplicaRuntime, now: float) -> None:
        """Warn when the replica's engine (its last table view) runs another tensor-parallel
        size than the profile was measured on: the profile's step times describe another
        engine, so the table starts from the wrong prior until live steps correct it."""
        profiled = rt.pool.profile.metadata.tensor_parallel_size
        live = None if rt.view is None else rt.view.tensor_parallel_size
        if profiled is None or live is None or profiled == live:
            return
        self.alerts.condition(
            Alert(
                names.PROFILE_SETUP,
                f"{rt.replica} runs another parallel layout than its profile",
                f"tensor-parallel size {live}, the profile's {profiled}",
                replica=rt.replica,
                pool=rt.pool.name,
            ),
            now,
        )

    def plugin(self, rt: ReplicaRuntime, now: float) -> None:
        """Warn when the replica's plugin counts step cells the way plugins did before
        2026-12-02 (its view says so, or lacks the field): it files the step before each
        neighbour burst in the running k's cell and the burst's last step in the burst's, so
        bursts read faster than their k runs (0.84-0.89 at decode-heavy B≈254 on the H200) and
        the daemon may push a k that loses, for the guard to roll back."""
        if rt.view is None or rt.view.step_switch_rule == "drafts":
            return
        self.alerts.condition(
            Alert(
                names.PLUGIN_OUTDATED,
                f"{rt.replica}'s plugin counts step cells by the k verified",
                f"plugin {rt.view.plugin_version}: neighbour bursts read faster than their k "
                "runs; install this tabletune in the engine's environment",
                replica=rt.replica,
                pool=rt.pool.name,
            ),
            now,
        )

    def _traffic_shape(self, rt: ReplicaRuntime, cells: StepCells, now: float) -> None:
        """Warn when live steps carry more (or less) prefill than the profile was timed with:
        its step times then misstate serving steps before any drift is measured."""
        shape = rt.pool.profile.metadata.timing_shape
        problems: list[str] = []
        busiest = sorted(cells.items(), key=lambda item: -item[1].steps)
        for (k, _, _), totals in busiest:
            if totals.steps < self.settings.drift.min_steps or totals.requests <= 0:
                continue
            for problem in profile_shape_mismatch(
                shape,
                k=k,
                live_batch=totals.requests / totals.steps,
                live_tokens_per_step=totals.tokens / totals.steps,
            ):
                if problem not in problems:
                    problems.append(problem)
        if problems:
            self.alerts.condition(
                Alert(
                    names.PROFILE_SHAPE,
                    f"{rt.replica} serves traffic unlike the profile's timing shape",
                    "; ".join(problems[:3]),
                    replica=rt.replica,
                    pool=rt.pool.name,
                ),
                now,
            )

    def _step_drift(self, rt: ReplicaRuntime, cells: StepCells, now: float) -> None:
        drifts = step_drifts(rt.step_time.layout, cells, min_steps=self.settings.drift.min_steps)
        self.metrics.set_step_time_ratios(rt.replica, [(d.k, d.cell, d.ratio) for d in drifts])
        if not drifts or abs(drifts[0].ratio - 1.0) <= self.settings.drift.profile_threshold:
            return
        worst = drifts[0]
        self.alerts.condition(
            Alert(
                names.PROFILE_DRIFT,
                f"step times of {rt.replica} differ from the profile",
                f"k={worst.k}, B in {cell_label(worst.cell)}: live {worst.ratio:.2f}x the "
                f"profile over {worst.steps:.0f} steps ({worst.mean_tokens:.0f} tokens per step)",
                replica=rt.replica,
                pool=rt.pool.name,
            ),
            now,
        )
