"""The daemon's cycle end to end with a fake clock, a model engine and the real admin state."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog

from tabletune.admin.protocol import TableView
from tabletune.admin.state import TableState
from tabletune.daemon import alerts as names
from tabletune.daemon.alerts import AlertSink
from tabletune.daemon.controller import Controller
from tabletune.daemon.metrics import DaemonMetrics
from tabletune.daemon.profiles import make_pool
from tabletune.daemon.settings import DaemonSettings, load_settings
from tabletune.daemon.state import StateStore
from tabletune.schemas.profile import step_times_of
from tabletune.schemas.table import normalize_ranges
from tabletune.solver import StepTimes, TableProblem, dense_lookup, evaluate_table, solve
from tests.support.servers import poll_until
from tests.unit.daemon_fakes import FakeAdmin, FakeClock, ModelEngine, ModelSource, small_profile

PRIOR = (0.8, 0.6, 0.45)
START = [[1, 8, 0], [9, 32, 1], [33, 64, 2], [65, 128, 3]]  # every k captured, mostly wrong
INTERVAL = 30.0


def settings_with(**env: str) -> DaemonSettings:
    # The model engine's steps take exactly the profile's T: no uncertainty beyond the floor.
    base = {"TABLETUNE_LOOP__INTERVAL_S": str(INTERVAL), "TABLETUNE_STEP_TIME__PRIOR_SIGMA": "0"}
    base.update({f"TABLETUNE_{key}": value for key, value in env.items()})
    return load_settings(base)


class Rig:
    """A controller wired to model engines, with everything it did observable."""

    def __init__(
        self,
        settings: DaemonSettings,
        *,
        rates: tuple[float, ...] = PRIOR,
        replicas: tuple[str, ...] = ("r1",),
        state_dir: Path | None = None,
        dry_run: bool = False,
        profile_tensor_parallel_size: int | None = None,
    ) -> None:
        profile = small_profile(prior=PRIOR)
        self.profile = profile.model_copy(
            update={
                "metadata": profile.metadata.model_copy(
                    update={"tensor_parallel_size": profile_tensor_parallel_size}
                )
            }
        )
        self.pool = make_pool(self.profile, None)
        self.step_times = step_times_of(self.profile)
        self.clock = FakeClock()
        self.engines = {
            name: ModelEngine(
                step_times=self.step_times,
                rates=rates,
                state=TableState.initial(START, num_speculative_tokens=3, max_num_seqs=128),
            )
            for name in replicas
        }
        self.admins = {name: FakeAdmin(engine) for name, engine in self.engines.items()}
        self.source = ModelSource(self.engines, self.clock)
        self.metrics = DaemonMetrics()
        self.sent: list[list[dict[str, object]]] = []
        self.alerts = AlertSink(
            settings=settings.alerts, condition_ttl_s=4 * INTERVAL, poster=self.sent.append
        )
        self.controller = Controller(
            settings=settings,
            source=self.source,
            pools=[self.pool],
            admin_for=lambda url: self.admins[url],
            alerts=self.alerts,
            metrics=self.metrics,
            store=StateStore(state_dir) if state_dir else None,
            clock=self.clock,
            sleep=self.clock.sleep,
            dry_run=dry_run,
        )

    def cycles(self, count: int) -> list[object]:
        reports = []
        for _ in range(count):
            reports.append(self.controller.run_cycle())
            self.clock.now += INTERVAL
        return reports

    def oracle(self, rates: tuple[float, ...]) -> tuple[tuple[int, int, int], ...]:
        """The daemon's table when it knows T exactly: keep the starting table's k unless
        another is better by more than the stickiness, no range narrower than the hysteresis
        band (2 h + 1 = 5 by default)."""
        problem = TableProblem(
            step_times=self.step_times,
            rates=rates,
            allowed_k={0, 1, 2, 3},
            max_batch=128,
            baseline=tuple(dense_lookup(normalize_ranges(START), 128, 3)[1:]),
            min_width=5,
        )
        return solve(problem).ranges

    def alert_names(self) -> set[str]:
        return {key[0] for key in self.alerts.active}

    def posted(self, alertname: str) -> list[dict[str, object]]:
        return [
            alert
            for batch in self.sent
            for alert in batch
            if alert["labels"]["alertname"] == alertname  # type: ignore[index]
        ]

    def happened(self, alertname: str) -> list[dict[str, object]]:
        """The distinct events posted (each is re-sent every cycle until it ends)."""
        distinct: dict[str, dict[str, object]] = {}
        for alert in self.posted(alertname):
            distinct.setdefault(json.dumps(alert, sort_keys=True), alert)
        return list(distinct.values())


def step_time_ratios(rig: Rig) -> dict[tuple[str, str], float]:
    """The daemon's live/profile step-time ratios of replica r1: (k, batch) -> ratio."""
    return {
        (s.labels["k"], s.labels["batch"]): s.value
        for family in rig.metrics.registry.collect()
        for s in family.samples
        if s.name == "tabletune_daemon_step_time_ratio" and s.labels["replica"] == "r1"
    }


def test_pushes_the_oracle_table_after_the_first_rebuild() -> None:
    rig = Rig(settings_with())
    engine = rig.engines["r1"]
    assert engine.state.ranges != rig.oracle(PRIOR)
    rig.cycles(3)
    assert engine.state.ranges == rig.oracle(PRIOR)
    assert (
        rig.metrics.sample("tabletune_daemon_pushes_total", {"replica": "r1", "outcome": "ok"}) == 1
    )
    shifted = rig.happened(names.TABLE_SHIFTED)
    assert len(shifted) == 1
    assert shifted[0]["annotations"]["new_table"] == str([list(r) for r in rig.oracle(PRIOR)])  # type: ignore[index]
    # The plugin got the exploration and hysteresis settings.
    assert (engine.state.exploration_interval, engine.state.hysteresis) == (50, 2)
    # Nothing more to do: the next cycles push nothing.
    version = engine.state.version
    rig.cycles(3)
    assert engine.state.version == version


def test_steady_state_reads_the_table_only_to_refresh() -> None:
    rig = Rig(settings_with(ADMIN__REFRESH_S="300"))
    rig.cycles(3)
    calls = list(rig.admins["r1"].calls)
    rig.cycles(8)  # up to 270 s after the last read: cached view, no admin traffic
    assert rig.admins["r1"].calls == calls
    rig.cycles(2)  # past refresh_s: one GET
    assert rig.admins["r1"].calls == [*calls, "GET"]


def test_follows_an_acceptance_switch() -> None:
    # Positions the new table rarely drafts (exploration only) keep little live evidence
    # against w=2000; prior decay lets that evidence win (docs/design.md: the trap).
    rig = Rig(settings_with(ESTIMATOR__PRIOR_DECAY="true"))
    rig.cycles(3)
    engine = rig.engines["r1"]
    low = (0.3, 0.1, 0.03)
    assert rig.oracle(low) != rig.oracle(PRIOR)
    engine.rates = low
    rig.cycles(10)
    # The right k at the running load: the table's goodput there is the oracle's (the estimate
    # of positions the table rarely drafts is still pulled toward the prior, by design).
    ran = evaluate_table(rig.step_times, low, engine.state.ranges, max_batch=128)
    best = evaluate_table(rig.step_times, low, rig.oracle(low), max_batch=128)
    assert ran.goodput[engine.load - 1] >= 0.985 * best.goodput[engine.load - 1]
    assert engine.state.ranges != rig.oracle(PRIOR)
    assert names.ACCEPTANCE_DRIFT in rig.alert_names()
    estimate = rig.metrics.sample(
        "tabletune_daemon_acceptance_estimate", {"unit": "r1", "position": "1"}
    )
    assert estimate is not None and abs(estimate - 0.3) < 0.03


def test_first_sight_repairs_the_table_from_the_prior_at_once() -> None:
    rig = Rig(settings_with(ESTIMATOR__REBUILD_EVERY_DRAFTS="100000000"))
    reports = rig.cycles(2)  # the first cycle only takes the counters' baseline
    assert rig.engines["r1"].state.ranges == rig.oracle(PRIOR)
    assert reports[1].decisions["r1"].push  # type: ignore[attr-defined]


def test_no_push_before_enough_new_drafts() -> None:
    rig = Rig(
        settings_with(
            ESTIMATOR__REBUILD_EVERY_DRAFTS="100000000", DECISION__FIRST_SIGHT_FROM_PRIOR="false"
        )
    )
    rig.cycles(5)
    assert rig.engines["r1"].state.ranges == tuple(tuple(r) for r in START)
    assert rig.engines["r1"].state.version == 1  # only the plugin settings were set


def test_no_push_when_the_predicted_gain_is_below_the_threshold() -> None:
    rig = Rig(settings_with(DECISION__MIN_GAIN="0.9"))
    reports = rig.cycles(3)
    decisions = [d for r in reports for d in r.decisions.values()]  # type: ignore[attr-defined]
    assert decisions and not any(d.push for d in decisions)
    assert "threshold" in decisions[0].reason
    assert rig.engines["r1"].state.ranges == tuple(tuple(r) for r in START)


def test_dry_run_decides_but_changes_nothing() -> None:
    rig = Rig(settings_with(), dry_run=True)
    reports = rig.cycles(3)
    assert any(d.push for r in reports for d in r.decisions.values())  # type: ignore[attr-defined]
    assert rig.engines["r1"].state.version == 0
    assert rig.admins["r1"].calls.count("PUT table") == 0


def test_replica_restart_gets_the_table_again() -> None:
    rig = Rig(settings_with())
    rig.cycles(3)
    engine = rig.engines["r1"]
    assert engine.state.ranges == rig.oracle(PRIOR)
    engine.restart(START)
    reports = rig.cycles(2)
    assert engine.state.ranges == rig.oracle(PRIOR)
    assert any("restarted" in d.reason for r in reports for d in r.decisions.values())  # type: ignore[attr-defined]


def test_source_outage_no_push_alert_then_recovery() -> None:
    rig = Rig(settings_with())
    rig.cycles(1)  # baseline
    rig.source.down = "prometheus: connection refused"
    reports = rig.cycles(3)
    assert all(r.outage for r in reports)  # type: ignore[attr-defined]
    assert rig.admins["r1"].calls == []
    assert names.STALE_DATA in rig.alert_names()
    assert rig.metrics.sample("tabletune_daemon_errors_total", {"kind": "source"}) == 3
    rig.source.down = None
    rig.cycles(2)
    assert names.STALE_DATA not in rig.alert_names()
    # The last word on it is a resolution: ends at the time it was sent, not cycles ahead.
    last = rig.posted(names.STALE_DATA)[-1]
    sent_by = datetime.fromtimestamp(rig.clock.now, UTC)
    assert datetime.fromisoformat(str(last["endsAt"]).replace("Z", "+00:00")) <= sent_by
    assert rig.engines["r1"].state.ranges == rig.oracle(PRIOR)


def test_missing_replica_is_stale_and_not_pushed() -> None:
    rig = Rig(settings_with(), replicas=("r1", "r2"))
    rig.source.missing = {"r2"}
    rig.cycles(3)
    assert rig.engines["r2"].state.version == 0
    assert rig.engines["r1"].state.ranges == rig.oracle(PRIOR)
    assert (names.STALE_DATA, "r2", "") in rig.alerts.active
    assert rig.metrics.sample("tabletune_daemon_replica_stale", {"replica": "r2"}) == 1


def test_admin_5xx_is_retried_on_the_schedule() -> None:
    rig = Rig(settings_with())
    rig.cycles(1)
    rig.admins["r1"].fail_next = 3
    rig.cycles(1)
    assert rig.clock.slept == [1.0, 1.0, 2.0]
    rig.cycles(1)
    assert rig.engines["r1"].state.ranges == rig.oracle(PRIOR)


def test_admin_down_alerts_then_nothing_is_lost() -> None:
    rig = Rig(settings_with(ADMIN__RETRY_BACKOFFS_S="1,2"))
    rig.cycles(1)
    rig.admins["r1"].fail_next = 10**6
    reports = rig.cycles(2)
    assert all(r.failed == ["r1"] for r in reports)  # type: ignore[attr-defined]
    assert names.PUSH_FAILED in rig.alert_names()
    assert rig.clock.slept[:2] == [1.0, 2.0]
    rig.admins["r1"].fail_next = 0
    rig.cycles(1)
    assert rig.engines["r1"].state.ranges == rig.oracle(PRIOR)
    rig.cycles(1)
    assert names.PUSH_FAILED not in rig.alert_names()


def test_refused_push_is_not_retried() -> None:
    rig = Rig(settings_with())
    # A static-k engine refuses every table with 409... but a static view is not pushed at all;
    # use a table the engine cannot take instead: allowed k shrinks to {0} after start.
    engine = rig.engines["r1"]
    engine.state = TableState.initial([[1, 128, 0]], num_speculative_tokens=3, max_num_seqs=128)
    reports = rig.cycles(3)
    assert all(not d.push for r in reports for d in r.decisions.values())  # type: ignore[attr-defined]
    assert rig.clock.slept == []


def slow_once_pushed(cooldown_s: str) -> Rig:
    """A rig whose engine runs every table but its first 3x slower than the profile says (a
    drafter whose work grows with acceptance): a push looks good on paper and is bad in
    reality, and the guard (one sample enough) rolls it back."""
    rig = Rig(settings_with(GUARD__MIN_SAMPLES="1", GUARD__COOLDOWN_S=cooldown_s))
    engine = rig.engines["r1"]
    before = engine.state.ranges
    original_run = engine.run

    def slow_when_changed(seconds: float) -> None:
        engine.step_scale = 1.0 if engine.state.ranges == before else 3.0
        original_run(seconds)

    engine.run = slow_when_changed  # type: ignore[method-assign]
    return rig


def test_guard_rolls_back_a_push_that_lowered_goodput() -> None:
    rig = slow_once_pushed(cooldown_s="100000")
    engine = rig.engines["r1"]
    before = engine.state.ranges
    rig.cycles(2)
    assert engine.state.ranges != before  # pushed
    reports = rig.cycles(2)
    assert any(r.rolled_back for r in reports)  # type: ignore[attr-defined]
    assert engine.state.ranges == before
    assert rig.posted(names.ROLLBACK)
    assert rig.metrics.sample("tabletune_daemon_rollbacks_total", {"replica": "r1"}) == 1
    rig.cycles(3)
    assert engine.state.ranges == before  # held during the cooldown


@pytest.mark.parametrize("shifts", [True, False])
def test_a_traffic_shift_after_a_rollback_ends_its_hold(shifts: bool) -> None:
    """The guard judged the table it rolled back on the traffic its samples saw; once the
    traffic shifts, the daemon decides for the new traffic at once instead of waiting out the
    cooldown (here all but endless): the load then moves and a decision is due, made only
    where the traffic shifted."""
    rig = slow_once_pushed(cooldown_s="100000")
    engine = rig.engines["r1"]
    before = engine.state.ranges
    reports = rig.cycles(3)
    assert reports[-1].rolled_back and engine.state.ranges == before  # type: ignore[attr-defined]
    rig.cycles(1)  # the rolled-back table's traffic settles (no shift is read meanwhile)
    if shifts:  # the running k's steps now take twice as long: another shape of traffic
        engine.k_scale = {engine.state.k_for(engine.load): 2.0}
    rig.cycles(3)
    engine.load = 100
    decided = [r.decisions for r in rig.cycles(3)]  # type: ignore[attr-defined]
    assert any(decided) is shifts


@pytest.mark.parametrize(("cooldown_s", "interval"), [("100000", 128), ("0", 32)])
def test_bursts_run_at_the_recheck_interval_while_a_rollback_holds_pushes(
    cooldown_s: str, interval: int
) -> None:
    """Nothing bursts find can be pushed during a rollback's hold: from the rollback's own
    cycle its bursts run every 128 steps; then the load moves where k=2 is unmeasured, and its
    first looks run every 128 steps while the hold lasts (every 32 without one)."""
    rig = slow_once_pushed(cooldown_s)
    engine = rig.engines["r1"]
    reports = rig.cycles(3)
    assert reports[-1].rolled_back  # type: ignore[attr-defined]
    assert engine.state.neighbour_ks and engine.state.neighbour_interval == interval
    engine.load = 100
    rig.cycles(2)
    assert engine.state.neighbour_ks == (2,)
    assert engine.state.neighbour_interval == interval


def test_profile_drift_is_alerted() -> None:
    rig = Rig(settings_with())
    rig.engines["r1"].step_scale = 1.6
    rig.cycles(3)
    assert names.PROFILE_DRIFT in rig.alert_names()
    # Each cell is compared with the profile at its own batch size: exactly the injected 1.6.
    ratios = step_time_ratios(rig)
    assert ratios and all(k_batch[1] == "16" for k_batch in ratios)
    assert all(r == pytest.approx(1.6, rel=1e-9) for r in ratios.values())


def test_live_traffic_unlike_the_profiles_shape_is_warned() -> None:
    # The profile (no recorded shape: pure decode) against steps carrying 200 prompt tokens
    # each: the profile's step times read low for this traffic, even before they drift.
    rig = Rig(settings_with())
    rig.engines["r1"].prefill_tokens_per_step = 200.0
    rig.cycles(3)
    assert names.PROFILE_SHAPE in rig.alert_names()
    alert = next(a for a in rig.alerts.active.values() if a.name == names.PROFILE_SHAPE)
    assert "200 prefill tokens per step" in alert.description


@pytest.mark.parametrize(
    ("profiled", "live", "warned"),
    [(2, 4, True), (2, 2, False), (None, 4, False), (2, None, False)],
)
def test_a_replica_on_another_tensor_parallel_size_than_its_profile_is_warned(
    profiled: int | None, live: int | None, warned: bool
) -> None:
    rig = Rig(settings_with(), profile_tensor_parallel_size=profiled)
    admin = rig.admins["r1"]
    admin.identity = replace(admin.identity, tensor_parallel_size=live)
    rig.cycles(3)
    assert (names.PROFILE_SETUP in rig.alert_names()) is warned
    if warned:
        alert = next(a for a in rig.alerts.active.values() if a.name == names.PROFILE_SETUP)
        assert "tensor-parallel size 4, the profile's 2" in alert.description


@pytest.mark.parametrize("rule", ["verified", None, "drafts"])
def test_a_plugin_counting_by_the_k_verified_is_warned(
    monkeypatch: pytest.MonkeyPatch, rule: str | None
) -> None:
    # A plugin from before 2026-12-02 says "verified", or nothing (the field's default).
    rig = Rig(settings_with())
    admin = rig.admins["r1"]
    answer = admin.answer

    def older(request: Any, if_match: int | None) -> Any:
        view = answer(request, if_match)
        wire = view.model_dump()
        if rule is None:
            del wire["step_switch_rule"]
        else:
            wire["step_switch_rule"] = rule
        return type(view).model_validate(wire)

    monkeypatch.setattr(admin, "answer", older)
    rig.cycles(3)
    assert (names.PLUGIN_OUTDATED in rig.alert_names()) is (rule != "drafts")
    if rule != "drafts":
        alert = next(a for a in rig.alerts.active.values() if a.name == names.PLUGIN_OUTDATED)
        assert alert.replica == "r1" and "by the k verified" in alert.summary


def test_pure_decode_matches_a_pure_decode_profile() -> None:
    rig = Rig(settings_with())
    rig.engines["r1"].prefill_tokens_per_step = 4.0  # a short prompt now and then
    rig.cycles(3)
    assert names.PROFILE_SHAPE not in rig.alert_names()


def test_pool_scope_estimates_once_for_all_replicas() -> None:
    rig = Rig(settings_with(ESTIMATOR__SCOPE="pool"), replicas=("r1", "r2"))
    rig.cycles(3)
    assert set(rig.controller.units) == {rig.pool.name}
    assert all(e.state.ranges == rig.oracle(PRIOR) for e in rig.engines.values())


def test_state_survives_a_restart(tmp_path: Path) -> None:
    rig = Rig(settings_with(), state_dir=tmp_path)
    rig.cycles(3)
    unit = rig.controller.units["r1"]
    again = Rig(settings_with(), state_dir=tmp_path)
    again.controller.restore()
    again.source.engines = rig.engines
    resumed = again.controller._unit("r1", again.pool)
    assert resumed.state == unit.state
    assert resumed.rates == unit.rates
    assert again.controller._saved_replicas["r1"].pushed == [list(r) for r in rig.oracle(PRIOR)]


def test_a_k_held_to_its_run_is_still_held_after_a_restart(tmp_path: Path) -> None:
    rig = Rig(settings_with(), state_dir=tmp_path)
    k3_misread_by_bursts(rig)
    rig.cycles(12)  # k=3 put in on the profile's promise, its run read slow, k=2 back
    held = rig.controller.replicas["r1"].oversold
    assert list(held) == [(3, 41)] and 1.4 < held[(3, 41)][0] < 1.8
    again = Rig(settings_with(), state_dir=tmp_path)
    again.controller.restore()
    again.source.engines = rig.engines
    again.admins = rig.admins
    again.clock.now = rig.clock.now
    again.cycles(2)  # the first reading of the counters is a baseline: the replica comes back
    assert again.controller.replicas["r1"].oversold == held
    assert rig.engines["r1"].state.k_for(48) != 3


def test_corrupt_state_is_moved_aside_and_reported(tmp_path: Path) -> None:
    (tmp_path / "daemon-state.json").write_text('{"schema_version": 1, "units": {"r1": 3}')
    rig = Rig(settings_with(), state_dir=tmp_path)
    rig.controller.restore()
    assert list(tmp_path.glob("daemon-state.json.bad-*"))
    assert rig.metrics.sample("tabletune_daemon_errors_total", {"kind": "state"}) == 1
    rig.cycles(3)  # runs normally and writes a good file
    assert rig.engines["r1"].state.ranges == rig.oracle(PRIOR)
    assert StateStore(tmp_path).load()[1] is None


def test_a_failed_cycle_is_logged_with_its_traceback_and_the_loop_goes_on() -> None:
    from tabletune.daemon.service import Daemon

    rig = Rig(settings_with())
    daemon = Daemon(
        settings=rig.controller.settings, controller=rig.controller, metrics=rig.metrics
    )
    real_collect = rig.source.collect
    calls = 0

    def flaky(now: float, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("bug in a source")
        return real_collect(now, **kwargs)  # type: ignore[arg-type]

    rig.source.collect = flaky  # type: ignore[method-assign]
    with structlog.testing.capture_logs() as logs:
        for _ in range(4):
            daemon.safe_cycle()
            rig.clock.now += INTERVAL
    failed = [entry for entry in logs if entry["event"] == "cycle failed"]
    assert len(failed) == 1 and failed[0]["exc_info"] is True
    assert rig.metrics.sample("tabletune_daemon_cycles_total", {"outcome": "failed"}) == 1
    assert rig.metrics.sample("tabletune_daemon_cycles_total", {"outcome": "ok"}) == 3
    assert rig.engines["r1"].state.ranges == rig.oracle(PRIOR)


def test_no_profile_drift_alarm_while_serving_matches_the_profile() -> None:
    rig = Rig(settings_with())
    rig.engines["r1"].load = 40  # inside an 8-wide cell (33-40): compared at its own mean B
    rig.cycles(12)
    assert names.PROFILE_DRIFT not in rig.alert_names()
    ratios = step_time_ratios(rig)
    assert ratios and all(k_batch[1] == "33-40" for k_batch in ratios)
    assert all(r == pytest.approx(1.0, rel=1e-9) for r in ratios.values())


def test_a_30_percent_slowdown_is_flagged_within_a_minute() -> None:
    rig = Rig(settings_with(LOOP__INTERVAL_S="15"))
    rig.cycles(4)
    assert names.PROFILE_DRIFT not in rig.alert_names()
    rig.engines["r1"].step_scale = 1.3
    start = rig.clock.now
    while names.PROFILE_DRIFT not in rig.alert_names():
        rig.controller.run_cycle()
        rig.clock.now += 15.0
        assert rig.clock.now - start <= 60.0


def test_a_k_slower_in_serving_than_profiled_is_replaced_at_the_load_it_hurts() -> None:
    # Serving makes k=3 1.6x slower than the profile at every batch size (say its steps
    # leave the CUDA graphs); the profile prefers k=3 at this load, so the first decision
    # puts k=3 there. Live step time sees it (k=3 runs, its neighbour k=2 is measured in
    # bursts) and the table moves off k=3 again.
    rig = Rig(settings_with())
    engine = rig.engines["r1"]
    engine.load = 48
    assert engine.state.k_for(48) == 2 and rig.oracle(PRIOR)[0] == (1, 104, 3)
    engine.k_scale = {3: 1.6}
    truth = StepTimes(
        grid=rig.step_times.grid,
        ks=rig.step_times.ks,
        ms=rig.step_times.ms * np.array([[1.0], [1.0], [1.0], [1.6]]),
    )
    best = evaluate_table(truth, PRIOR, ((1, 128, 3),), max_batch=128)
    rig.cycles(12)
    ran = evaluate_table(truth, PRIOR, engine.state.ranges, max_batch=128)
    assert engine.state.k_for(48) != 3
    assert ran.goodput[47] >= 0.985 * best.best_fixed_goodput[47]


def k3_misread_by_bursts(rig: Rig) -> ModelEngine:
    """Replica r1 at B=48, where k=3 runs 1.6x slower than profiled but its bursts, amid
    another k's run, read it as profiled."""
    engine = rig.engines["r1"]
    engine.load = 48
    engine.k_scale, engine.burst_scale = {3: 1.6}, {3: 1 / 1.6}
    return engine


def k3_pushes_after_a_shift(**env: str) -> tuple[int, list[int]]:
    """k=3 runs 1.6x slower than profiled at B=48 but its bursts, amid k=2's run, read it as
    profiled (as bursts read k=1 at 0.82 of its run on the H200 at decode-heavy B≈254): the
    first decision puts k=3 in on the profile's promise, its run reads slow, k=2 comes back.
    Then every step slows by 30 % (the shift check clears what the cell knew of k=3's run) and
    the bursts read k=3 fast again. The k at 48 cycle by cycle after that shift, and how many
    pushes put k=3 in before it."""
    rig = Rig(settings_with(**env))
    engine = k3_misread_by_bursts(rig)
    seen = []
    for _ in range(12):
        rig.cycles(1)
        seen.append(engine.state.k_for(48))
    first = sum(1 for a, b in zip([2, *seen], seen, strict=False) if b == 3 and a != 3)
    assert seen[-1] != 3
    engine.step_scale = 1.6
    after = []
    for _ in range(16):
        rig.cycles(1)
        after.append(engine.state.k_for(48))
    return first, after


def test_a_k_whose_run_read_slower_than_its_estimate_is_not_put_back_on_its_bursts() -> None:
    first, held = k3_pushes_after_a_shift()
    assert first == 1 and 3 not in held
    first, unheld = k3_pushes_after_a_shift(DECISION__OVERSOLD_FOR_S="0")
    assert first == 1 and 3 in unheld  # what the H200's daemon did, before


def replica_series(rig: Rig, replica: str) -> list[str]:
    return [
        sample.name
        for family in rig.metrics.registry.collect()
        for sample in family.samples
        if replica in (sample.labels.get("replica"), sample.labels.get("unit"))
    ]


def test_a_replica_that_left_is_forgotten_after_the_ttl(tmp_path: Path) -> None:
    rig = Rig(settings_with(LOOP__FORGET_AFTER_S="120"), replicas=("r1", "r2"), state_dir=tmp_path)
    rig.cycles(3)
    assert replica_series(rig, "r2")
    rig.source.missing = {"r2"}  # its pod is deleted: scrapes fail, then it is no longer named
    rig.cycles(2)
    assert (names.STALE_DATA, "r2", "") in rig.alerts.active
    rig.source.removed = {"r2"}
    reports = rig.cycles(3)
    assert [r.forgotten for r in reports] == [[], ["r2"], []]  # type: ignore[attr-defined]
    # 120 s after its last data: alerts resolved, series, runtime and saved records gone.
    assert not any(key[1] == "r2" for key in rig.alerts.active)
    assert rig.posted(names.STALE_DATA)[-1]["endsAt"] != rig.posted(names.STALE_DATA)[0]["endsAt"]
    assert replica_series(rig, "r2") == []
    assert "r2" not in rig.controller.replicas and "r2" not in rig.controller.units
    saved = StateStore(tmp_path).load()[0]
    assert set(saved.replicas) == {"r1"} and set(saved.units) == {"r1"}
    assert rig.source.forgotten == ["r2"]
    # r1 never noticed.
    assert rig.engines["r1"].state.ranges == rig.oracle(PRIOR)
    assert not any(key[1] == "r1" for key in rig.alerts.active)
    # It comes back (same address): a new replica, baseline then first sight.
    rig.source.missing = rig.source.removed = set()
    reports = rig.cycles(2)
    assert "r2" in reports[1].observed  # type: ignore[attr-defined]
    assert "r2" in rig.controller.replicas and replica_series(rig, "r2")


def test_a_forgotten_replica_still_named_raises_no_new_alert() -> None:
    rig = Rig(settings_with(LOOP__FORGET_AFTER_S="120"), replicas=("r1", "r2"))
    rig.cycles(2)
    rig.source.missing = {"r2"}  # down for good, still in the list of replicas
    reports = rig.cycles(10)
    assert sum(len(r.forgotten) for r in reports) == 1  # type: ignore[attr-defined]
    assert all("r2" in r.problems for r in reports)  # type: ignore[attr-defined]
    assert (names.STALE_DATA, "r2", "") not in rig.alerts.active
    assert replica_series(rig, "r2") == []


def test_a_source_outage_longer_than_the_ttl_forgets_nobody() -> None:
    # The soak: Prometheus down 60 s with a 60 s TTL forgot all 200 running replicas.
    rig = Rig(settings_with(LOOP__FORGET_AFTER_S="120"), replicas=("r1", "r2"))
    rig.cycles(3)
    rig.source.down = "Prometheus: connection refused"
    assert all(r.outage for r in rig.cycles(10))  # 300 s blind
    rig.source.down = None
    rig.source.missing = {"r1", "r2"}  # back, but no window can be vouched for yet
    reports = rig.cycles(2)
    rig.source.missing = {"r2"}  # r1 has data again; r2 really left
    reports += rig.cycles(10)
    forgotten = [r.forgotten for r in reports]  # type: ignore[attr-defined]
    assert [r for gone in forgotten for r in gone] == ["r2"]
    # r2 went once the source had brought data for 120 s (4 cycles of 30 s from the third
    # cycle back, when r1's data came), not at the first cycle back.
    assert forgotten.index(["r2"]) == 5
    assert "r1" in rig.controller.replicas


def test_a_saved_replica_never_seen_again_is_dropped_after_the_ttl(tmp_path: Path) -> None:
    rig = Rig(settings_with(), replicas=("r1", "r2"), state_dir=tmp_path)
    rig.cycles(3)
    again = Rig(settings_with(LOOP__FORGET_AFTER_S="120"), replicas=("r1",), state_dir=tmp_path)
    again.controller.restore()
    again.cycles(4)
    assert set(StateStore(tmp_path).load()[0].replicas) == {"r1", "r2"}  # 90 s: kept
    again.cycles(1)
    assert set(StateStore(tmp_path).load()[0].replicas) == {"r1"}


class HungAdmin(FakeAdmin):
    """An engine whose admin API accepts requests and never answers (until released)."""

    def __init__(self, engine: ModelEngine) -> None:
        super().__init__(engine)
        self.release = threading.Event()

    def get_table(self) -> TableView:
        self.calls.append("GET (hangs)")
        self.release.wait()
        return super().get_table()


def test_a_hung_admin_api_delays_no_other_replica() -> None:
    # A 1.6 s budget in real time (the rest of the test runs on the fake clock).
    rig = Rig(settings_with(LOOP__INTERVAL_S="2"), replicas=("r1", "r2", "r3", "r4"))
    hung = rig.admins["r4"] = HungAdmin(rig.engines["r4"])
    try:
        reports = rig.cycles(3)
        for name in ("r1", "r2", "r3"):
            assert rig.engines[name].state.ranges == rig.oracle(PRIOR)
        # Sent less than its 5 s timeout before the 1.6 s budget ran out: no verdict yet; still
        # hanging a cycle later: failed.
        assert [r.deferred for r in reports] == [[], ["r4"], []]  # type: ignore[attr-defined]
        assert [r.failed for r in reports] == [[], [], ["r4"]]  # type: ignore[attr-defined]
        assert {key for key in rig.alerts.active} == {(names.PUSH_FAILED, "r4", "m|d|test-gpu")}
        assert rig.posted(names.STALE_DATA) == []
        assert hung.calls == ["GET (hangs)"]  # no second request while the first hangs
    finally:
        hung.release.set()
    poll_until(lambda: not rig.controller.io.busy("admin", "r4"), timeout_s=10, what="r4 free")
    rig.cycles(1)
    assert rig.engines["r4"].state.ranges == rig.oracle(PRIOR)
    assert not rig.alerts.active


def test_stopping_abandons_what_the_cycle_waits_for() -> None:
    rig = Rig(settings_with(LOOP__INTERVAL_S="600"), replicas=("r1", "r2"))
    hung = rig.admins["r2"] = HungAdmin(rig.engines["r2"])
    try:
        rig.cycles(1)
        threading.Timer(0.2, lambda: setattr(rig.controller, "stopping", True)).start()
        report = rig.controller.run_cycle()  # would wait 480 s for r2 without the stop
        assert report.abandoned and report.failed == []
        assert rig.engines["r1"].state.ranges == rig.oracle(PRIOR)
        assert not rig.alerts.active  # abandoning is not the replica's failure
    finally:
        hung.release.set()


def test_admin_calls_never_sent_in_time_are_no_replica_s_failure() -> None:
    # One worker, held by r1's hung admin API: r2's and r3's calls wait in line past the
    # budget. The daemon was behind, they did nothing wrong: no alert, decided next cycle.
    rig = Rig(
        settings_with(LOOP__INTERVAL_S="2", LOOP__CONCURRENCY="1", ADMIN__TIMEOUT_S="1"),
        replicas=("r1", "r2", "r3"),
    )
    hung = rig.admins["r1"] = HungAdmin(rig.engines["r1"])
    try:
        reports = rig.cycles(2)
        assert reports[1].failed == ["r1"]  # type: ignore[attr-defined]  (1 s without answer)
        assert sorted(reports[1].deferred) == ["r2", "r3"]  # type: ignore[attr-defined]
        assert set(rig.alerts.active) == {(names.PUSH_FAILED, "r1", "m|d|test-gpu")}
    finally:
        hung.release.set()
    poll_until(lambda: not rig.controller.io.busy("admin", "r1"), timeout_s=10, what="r1 free")
    rig.cycles(1)
    assert all(e.state.ranges == rig.oracle(PRIOR) for e in rig.engines.values())
