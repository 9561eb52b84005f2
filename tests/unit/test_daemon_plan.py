"""The planner: which effects one replica gets, decided without any I/O."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune import __version__
from tabletune.admin.protocol import EngineIdentity
from tabletune.admin.state import TableState
from tabletune.daemon.decide import Estimates, decide
from tabletune.daemon.guard import GoodputHistory, GoodputSample, PendingCheck
from tabletune.daemon.plan import (
    PlanInputs,
    PushTable,
    RollBack,
    SetPluginSettings,
    doubled_to,
    kept_or_doubled,
    load_moved,
    min_range_width,
    plan_replica,
    rollback_hold_until,
    same_traffic,
)
from tabletune.daemon.profiles import make_pool
from tabletune.daemon.runtime import ReplicaRuntime
from tabletune.daemon.settings import load_settings
from tabletune.daemon.step_time import MEASURED_STEPS
from tabletune.schemas.table import dense_lookup
from tabletune.solver import StepTimes
from tests.unit.daemon_fakes import replica_runtime, small_profile

POOL = make_pool(small_profile(), None)
START = [[1, 8, 0], [9, 32, 1], [33, 64, 2], [65, 128, 3]]
SETTINGS = load_settings({})
NOW = 10_000.0


def _view(exploration: int = 50, hysteresis: int = 2) -> object:
    state = TableState.initial(START, num_speculative_tokens=3, max_num_seqs=128)
    state = replace(
        state,
        exploration_interval=exploration,
        hysteresis=hysteresis,
        neighbour_interval=32,
        neighbour_burst=4,
    )
    return state.view(plugin_version=__version__, identity=EngineIdentity("0.26.0"))


def _runtime(**changes: object) -> ReplicaRuntime:
    return replica_runtime(POOL, load=40, **changes)


def _inputs(**changes: object) -> PlanInputs:
    inputs = PlanInputs(
        view=_view(),  # type: ignore[arg-type]
        now=NOW,
        restart=False,
        estimates=Estimates(step_times=POOL.step_times, rates=POOL.prior),
        load_weights={40: 1.0},
        rates_moved=False,
        estimate_ready=True,
        step_time_moved=False,
    )
    return replace(inputs, **changes)  # type: ignore[arg-type]


def test_nothing_due_nothing_done() -> None:
    plan = plan_replica(_runtime(), _inputs(), settings=SETTINGS, dry_run=False)
    assert plan.effects == () and plan.decision is None


@pytest.mark.parametrize(
    "due",
    [{"rates_moved": True}, {"restart": True}, {"step_time_moved": True}],
)
def test_a_reason_to_decide_pushes_a_better_table(due: dict[str, bool]) -> None:
    plan = plan_replica(_runtime(), _inputs(**due), settings=SETTINGS, dry_run=False)
    assert plan.decision is not None and plan.decision.push
    assert plan.effects == (PushTable(plan.decision),)


def test_wrong_plugin_settings_come_first_and_dry_run_changes_nothing() -> None:
    inputs = _inputs(view=_view(exploration=0, hysteresis=0), rates_moved=True)
    plan = plan_replica(_runtime(), inputs, settings=SETTINGS, dry_run=False)
    assert plan.effects[0] == SetPluginSettings(50, 2, 32, 4)
    assert isinstance(plan.effects[1], PushTable)
    dry = plan_replica(_runtime(), inputs, settings=SETTINGS, dry_run=True)
    assert dry.effects == () and dry.decision is not None and dry.decision.push


def _push_that_halved_goodput() -> tuple[PendingCheck, ReplicaRuntime]:
    """A push 150 s ago; its table ran at half the goodput (against the model) of the one
    before it, 3 samples each side."""
    history = GoodputHistory(keep_s=600)
    before = tuple(GoodputSample(NOW - 300 + i, 40.0, 100.0, 100.0) for i in range(3))
    for i in range(3):
        history.add(GoodputSample(NOW - 100 + i, 40.0, 50.0, 100.0))
    pending = PendingCheck(
        pushed_at=NOW - 150, pushed=((1, 128, 3),), previous=((1, 128, 1),), before=before
    )
    return pending, _runtime(pending=pending, history=history)


def test_a_push_that_lowered_goodput_is_rolled_back_instead_of_deciding() -> None:
    pending, rt = _push_that_halved_goodput()
    plan = plan_replica(rt, _inputs(rates_moved=True), settings=SETTINGS, dry_run=False)
    assert plan.verdict is not None and plan.verdict.outcome == "drop"
    assert plan.effects == (RollBack(pending, plan.verdict),)
    assert plan.decision is None


def test_a_rollbacks_cycle_spaces_the_bursts_for_the_hold_it_starts() -> None:
    pending, rt = _push_that_halved_goodput()
    inputs = _inputs(rates_moved=True, explore_ks=(1, 2), explore_sparse_if_held=True)
    plan = plan_replica(rt, inputs, settings=SETTINGS, dry_run=False)
    assert plan.verdict is not None
    assert plan.effects == (
        SetPluginSettings(50, 2, 128, 4, (1, 2)),
        RollBack(pending, plan.verdict),
    )
    # No rollback: the spacing for the cycle as it stands.
    calm = plan_replica(_runtime(), inputs, settings=SETTINGS, dry_run=False)
    assert SetPluginSettings(50, 2, 32, 4, (1, 2)) in calm.effects


def test_a_push_is_not_judged_against_samples_of_traffic_that_shifted_since() -> None:
    # The emulator's shape change (decode-heavy -> chat-like): goodput against the profile's
    # model fell with the new shape, every table alike; the right table, pushed after the
    # change, was rolled back against samples taken before it and the wrong one stayed.
    _, rt = _push_that_halved_goodput()
    rt.step_time.shifted_at = NOW - 200  # after the samples before the push, before it
    plan = plan_replica(rt, _inputs(rates_moved=True), settings=SETTINGS, dry_run=False)
    # No sample before the push is of this traffic: it waits, then passes as inconclusive.
    assert plan.verdict is not None and plan.verdict.outcome == "wait"
    assert not any(isinstance(e, RollBack) for e in plan.effects)


@given(
    st.lists(st.floats(0, 1000), max_size=8),
    st.one_of(st.none(), st.floats(0, 1000)),
)
def test_samples_kept_are_exactly_those_since_the_shift(
    times: list[float], shifted_at: float | None
) -> None:
    samples = tuple(GoodputSample(t, 40.0, 1.0, 1.0) for t in times)
    kept = same_traffic(samples, shifted_at)
    assert kept == tuple(s for s in samples if shifted_at is None or s.at > shifted_at)
    assert same_traffic(samples, None) == samples


def test_a_rollback_cooldown_holds_the_next_push() -> None:
    rt = _runtime(hold_until=NOW + 60)
    plan = plan_replica(rt, _inputs(rates_moved=True), settings=SETTINGS, dry_run=False)
    assert plan.held and plan.effects == ()


@pytest.mark.parametrize(
    ("shifted_at", "hold_until"),
    [
        (None, NOW + 600),  # no shift: the hold stands
        (NOW - 400, NOW + 600),  # a shift before the rollback: its hold stands
        (NOW - 100, NOW - 100),  # a shift after it: the hold ends there
        (NOW + 700, NOW + 600),  # a shift after the hold ended moves nothing
    ],
)
def test_a_rollbacks_hold_ends_when_the_traffic_shifts_after_it(
    shifted_at: float | None, hold_until: float
) -> None:
    rolled_back_at = NOW - 300
    assert rollback_hold_until(NOW + 600, rolled_back_at, shifted_at) == hold_until


def test_without_a_rollback_no_shift_makes_a_hold() -> None:
    assert rollback_hold_until(0.0, None, NOW) == 0.0


@settings(max_examples=200)
@given(
    hold=st.floats(0, 2e4),
    rolled_back_at=st.one_of(st.none(), st.floats(0, 2e4)),
    shifted_at=st.one_of(st.none(), st.floats(0, 2e4)),
)
def test_a_shift_only_ever_shortens_a_hold(
    hold: float, rolled_back_at: float | None, shifted_at: float | None
) -> None:
    until = rollback_hold_until(hold, rolled_back_at, shifted_at)
    assert until <= hold
    assert until == hold or (
        shifted_at is not None and rolled_back_at is not None and until == shifted_at
    )


def test_ranges_never_narrower_than_the_hysteresis_band() -> None:
    assert min_range_width(load_settings({"TABLETUNE_PLUGIN__HYSTERESIS": "3"})) == 7
    assert min_range_width(load_settings({"TABLETUNE_PLUGIN__HYSTERESIS": "0"})) == 1


def test_directed_bursts_run_only_at_the_chosen_k_and_stop_when_none_is_worth_it() -> None:
    chosen = plan_replica(_runtime(), _inputs(explore_ks=(1,)), settings=SETTINGS, dry_run=False)
    assert chosen.effects == (SetPluginSettings(50, 2, 32, 4, (1,)),)
    none = plan_replica(_runtime(), _inputs(explore_ks=()), settings=SETTINGS, dry_run=False)
    assert none.effects == (SetPluginSettings(50, 2, 0, 4, ()),)
    adjacent = plan_replica(_runtime(), _inputs(explore_ks=None), settings=SETTINGS, dry_run=False)
    assert adjacent.effects == ()  # the running settings are already the adjacent ones


def test_sparse_bursts_run_at_the_recheck_interval() -> None:
    rechecks = _inputs(explore_ks=(1, 2), explore_sparse=True)
    plan = plan_replica(_runtime(), rechecks, settings=SETTINGS, dry_run=False)
    assert plan.effects == (SetPluginSettings(50, 2, 128, 4, (1, 2)),)
    same_rate = load_settings({"TABLETUNE_PLUGIN__NEIGHBOUR_RECHECK_INTERVAL": "0"})
    plan = plan_replica(_runtime(), rechecks, settings=same_rate, dry_run=False)
    assert plan.effects == (SetPluginSettings(50, 2, 32, 4, (1, 2)),)


@pytest.mark.parametrize(
    ("spacing", "sparse", "interval"),
    [(0, False, 32), (32, False, 32), (33, False, 64), (100, False, 128), (300, True, 512)],
)
def test_priced_bursts_run_at_their_interval_doubled_past_their_spacing(
    spacing: int, sparse: bool, interval: int
) -> None:
    inputs = _inputs(explore_ks=(1, 2), explore_sparse=sparse, explore_spacing=spacing)
    plan = plan_replica(_runtime(), inputs, settings=SETTINGS, dry_run=False)
    assert plan.effects == (SetPluginSettings(50, 2, interval, 4, (1, 2)),)


@pytest.mark.parametrize(("spacing", "interval"), [(0, 50), (50, 50), (136, 200), (900, 1600)])
def test_acceptance_exploration_runs_at_its_interval_doubled_past_its_spacing(
    spacing: int, interval: int
) -> None:
    inputs = _inputs(explore_ks=(1,), exploration_spacing=spacing)
    plan = plan_replica(_runtime(), inputs, settings=SETTINGS, dry_run=False)
    assert plan.effects == (SetPluginSettings(interval, 2, 32, 4, (1,)),)
    off = load_settings({"TABLETUNE_PLUGIN__EXPLORATION_INTERVAL": "0"})
    plan = plan_replica(_runtime(), inputs, settings=off, dry_run=False)
    assert plan.effects[0].exploration_interval == 0  # off stays off, whatever its price


@pytest.mark.parametrize(
    ("running", "spacing", "interval"),
    [
        (400, 136, 400),  # wanted 200: the running 400 is within twice it, kept
        (400, 90, 100),  # wanted 100: 400 is more than twice it, down
        (200, 300, 400),  # wanted 400: 200 is too close, up
        (300, 136, 200),  # not a doubling of the setting: set
        (800, 136, 200),  # more than twice: down
    ],
)
def test_a_running_acceptance_interval_within_twice_its_price_is_kept(
    running: int, spacing: int, interval: int
) -> None:
    # At decode-heavy B≈254 on the H200 the price hovered around 200 steps and the daemon set
    # 200, 400, 200, ... cycle after cycle (a settings PUT each time).
    inputs = _inputs(view=_view(exploration=running), explore_ks=(1,), exploration_spacing=spacing)
    plan = plan_replica(_runtime(), inputs, settings=SETTINGS, dry_run=False)
    got = running if not plan.effects else plan.effects[0].exploration_interval
    assert got == interval


def test_no_bursts_stay_off_whatever_their_price() -> None:
    inputs = _inputs(explore_ks=(), explore_spacing=500)
    plan = plan_replica(_runtime(), inputs, settings=SETTINGS, dry_run=False)
    assert plan.effects == (SetPluginSettings(50, 2, 0, 4, ()),)


@given(st.integers(1, 4096), st.integers(0, 2_000_000))
def test_doubling_reaches_the_spacing_within_twice_it_and_the_api_bound(
    interval: int, spacing: int
) -> None:
    doubled = doubled_to(interval, spacing)
    assert doubled <= 1_000_000 and doubled % interval == 0
    assert doubled >= spacing or doubled * 2 > 1_000_000
    assert doubled == interval or doubled < 2 * spacing


@given(st.integers(1, 4096), st.integers(0, 100_000), st.integers(0, 2_000_000))
def test_a_kept_interval_is_a_doubling_past_the_spacing_within_twice_the_wanted(
    interval: int, running: int, spacing: int
) -> None:
    got, wanted = kept_or_doubled(running, interval, spacing), doubled_to(interval, spacing)
    assert got in (running, wanted) and wanted <= got <= 2 * wanted
    ratio = got // interval
    assert got % interval == 0 and ratio & (ratio - 1) == 0


def _held_back_inputs() -> PlanInputs:
    # k=3 is far better than the running k at B=40 by the means, but the step times are so
    # uncertain that the noise bar keeps the running table: a gain held back by noise.
    sigma = np.full((len(POOL.step_times.ks), POOL.step_times.max_batch), 0.5)
    estimates = Estimates(step_times=POOL.step_times, rates=POOL.prior, relative_sigma=sigma)
    return _inputs(estimates=estimates, rates_moved=True)


def test_a_gain_held_back_by_noise_is_said_so() -> None:
    plan = plan_replica(_runtime(), _held_back_inputs(), settings=SETTINGS, dry_run=False)
    assert plan.decision is not None and not plan.decision.push
    assert plan.decision.held_back
    clear = plan_replica(_runtime(), _inputs(rates_moved=True), settings=SETTINGS, dry_run=False)
    assert clear.decision is not None and clear.decision.push and not clear.decision.held_back


def test_a_held_back_decision_is_made_again_once_its_recheck_time_has_passed() -> None:
    # The estimates may not move past the replan thresholds while their uncertainty shrinks:
    # on the emulator a held-back table then stayed for good (the acceptance-switch test).
    recheck = SETTINGS.decision.recheck_held_back_s
    rt = _runtime(held_back=True, decided_at=NOW - recheck / 2)
    assert plan_replica(rt, _inputs(), settings=SETTINGS, dry_run=False).decision is None
    rt = _runtime(held_back=True, decided_at=NOW - recheck)
    plan = plan_replica(rt, _inputs(), settings=SETTINGS, dry_run=False)
    assert plan.decision is not None and plan.decision.push
    rt = _runtime(held_back=False, decided_at=NOW - 10 * recheck)
    assert plan_replica(rt, _inputs(), settings=SETTINGS, dry_run=False).decision is None


def test_a_load_that_moved_since_the_last_decision_calls_for_a_new_one() -> None:
    # The gain a decision weighed is the recent load's; a diurnal load that moves on leaves
    # batch sizes the decision never weighed (the emulator's acceptance switch: one decision
    # at B~60, then none while the load swept to 256 and the table there stayed wrong).
    assert load_moved(None, {40: 1.0})
    assert not load_moved(40.0, {40: 0.5, 44: 0.5})  # within one 8-wide cell
    assert load_moved(40.0, {64: 1.0})
    assert not load_moved(200.0, {215: 1.0})  # within 10 % of a large load
    assert load_moved(200.0, {240: 1.0})
    assert not load_moved(40.0, {})  # no load seen: nothing moved
    rt = _runtime(decided_load=40.0)
    plan = plan_replica(rt, _inputs(load_moved=True), settings=SETTINGS, dry_run=False)
    assert plan.decision is not None


def _k3_twice_as_fast(unproven_k: int | None) -> PlanInputs:
    """Estimates where k=3 runs at half the profile's time at B 33..64 (the table runs k=2
    there); ``unproven_k``'s estimate there leans on other k's live steps alone."""
    st = POOL.step_times
    ms = st.dense(128)
    ms[st.ks.index(3), 32:64] *= 0.5
    unproven = np.zeros(ms.shape, dtype=bool)
    if unproven_k is not None:
        unproven[st.ks.index(unproven_k), 32:64] = True
    estimates = Estimates(
        step_times=StepTimes(grid=tuple(range(1, 129)), ks=st.ks, ms=ms),
        rates=POOL.prior,
        relative_sigma=np.full(ms.shape, 0.01),
        unproven=unproven,
    )
    return _inputs(estimates=estimates, rates_moved=True)


def test_an_unproven_k_never_displaces_the_running_k() -> None:
    # Issue 16's shape change on the emulator: k=2 borrowed a low ratio from k=1 and k=0
    # after nine steps of its own and took the table from the measured k=3 (2.6 % lost).
    kept = plan_replica(_runtime(), _k3_twice_as_fast(3), settings=SETTINGS, dry_run=False)
    assert kept.decision is not None and not any(isinstance(e, PushTable) for e in kept.effects)
    for unproven in (None, 2):  # k=3 measured; or the running k=2 is the unproven one
        plan = plan_replica(
            _runtime(), _k3_twice_as_fast(unproven), settings=SETTINGS, dry_run=False
        )
        assert plan.decision is not None and plan.decision.push
        assert plan.decision.new is not None
        assert {k for start, end, k in plan.decision.new if start <= 40 <= end} == {3}


@given(
    st.lists(st.floats(min_value=0.3, max_value=3.0), min_size=4, max_size=4),
    st.lists(st.booleans(), min_size=4 * 16, max_size=4 * 16),
)
@settings(max_examples=60, deadline=None)
def test_no_batch_size_moves_to_an_unproven_k(factors: list[float], marks: list[bool]) -> None:
    # Any step times, any k unproven on any 8-wide block of batch sizes: where the table
    # changes k (no range merging: min_width 1), the new k is not unproven there.
    profile = POOL.step_times
    ms = profile.dense(128) * np.asarray(factors)[:, None]
    unproven = np.repeat(np.asarray(marks).reshape(4, 16), 8, axis=1)
    estimates = Estimates(
        step_times=StepTimes(grid=tuple(range(1, 129)), ks=profile.ks, ms=ms),
        rates=POOL.prior,
        relative_sigma=np.full(ms.shape, 0.01),
        unproven=unproven,
    )
    view = _view()
    decision = decide(
        estimates=estimates, view=view, load_weights={40: 1.0}, settings=SETTINGS.decision
    )
    assert decision.new is not None
    before = dense_lookup(START, 128, 3)
    after = dense_lookup(decision.new, 128, 3)
    for b in range(1, 129):
        if after[b] != before[b]:
            assert not unproven[profile.ks.index(after[b]), b - 1], b


def _k3_ahead_on(own_k3: float, own_k2: float) -> Estimates:
    """k=3 at half the profile's time at B 33..64 where the table runs k=2, with ``own_k3`` and
    ``own_k2`` live steps of their own there (the rest: none)."""
    profile = POOL.step_times
    ms = profile.dense(128)
    ms[profile.ks.index(3), 32:64] *= 0.5
    own = np.zeros(ms.shape)
    own[profile.ks.index(3), 32:64] = own_k3
    own[profile.ks.index(2), 32:64] = own_k2
    return _live(ms, own)


def _live(ms: np.ndarray, own: np.ndarray) -> Estimates:
    """Step times ``ms`` (rows ks, B 1..128) at 1 % uncertainty, each k with ``own`` live steps
    of its own (none run as the main k)."""
    return Estimates(
        step_times=StepTimes(grid=tuple(range(1, 129)), ks=POOL.step_times.ks, ms=ms),
        rates=POOL.prior,
        relative_sigma=np.full(ms.shape, 0.01),
        own_steps=own,
        run_steps=np.zeros(ms.shape),
    )


CHALLENGERS_MEASURED = load_settings(
    {"TABLETUNE_DECISION__CHALLENGER_MIN_STEPS": str(MEASURED_STEPS)}
).decision


def _k_at_40(estimates: Estimates, settings: object = CHALLENGERS_MEASURED) -> int:
    decision = decide(
        estimates=estimates,
        view=_view(),
        load_weights={40: 1.0},
        settings=settings,  # type: ignore[arg-type]
    )
    assert decision.new is not None
    return dense_lookup(decision.new, 128, 3)[40]


def test_a_k_a_few_bursts_measured_need_not_displace_a_running_k_measured_there() -> None:
    # With DECISION__CHALLENGER_MIN_STEPS at 30. H200 decode-heavy B≈254 (docs/results.md,
    # "At 1cd9e3d"): every push of k=1 stood on fewer than 30 burst steps (3 after a shift
    # check put it at 17 ms; it ran at twice that).
    assert _k_at_40(_k3_ahead_on(own_k3=3.0, own_k2=500.0)) == 2
    assert _k_at_40(_k3_ahead_on(own_k3=MEASURED_STEPS - 1, own_k2=500.0)) == 2
    assert _k_at_40(_k3_ahead_on(own_k3=MEASURED_STEPS, own_k2=500.0)) == 3  # measured now
    # Nothing live of its own (the profile and the other k speak for it), or the running k
    # not measured there either (first sight, a shift just cleared it): no bar.
    assert _k_at_40(_k3_ahead_on(own_k3=0.0, own_k2=500.0)) == 3
    assert _k_at_40(_k3_ahead_on(own_k3=3.0, own_k2=MEASURED_STEPS - 1)) == 3
    # Off (the default): a few steps speak as before.
    assert _k_at_40(_k3_ahead_on(own_k3=3.0, own_k2=500.0), SETTINGS.decision) == 3


@given(
    st.lists(st.floats(min_value=0.3, max_value=3.0), min_size=4, max_size=4),
    st.lists(st.sampled_from((0.0, 3.0, 29.0, 30.0, 500.0)), min_size=4 * 16, max_size=4 * 16),
)
@settings(max_examples=60, deadline=None)
def test_no_batch_size_moves_to_a_k_few_steps_measured_where_its_k_was_measured(
    factors: list[float], own_by_block: list[float]
) -> None:
    # Any step times, any live steps of its own per k and 8-wide block: where the table
    # changes k (no merging), the new k has no steps there, or MEASURED_STEPS, or the k it
    # replaces has fewer than MEASURED_STEPS.
    profile = POOL.step_times
    ms = profile.dense(128) * np.asarray(factors)[:, None]
    own = np.repeat(np.asarray(own_by_block).reshape(4, 16), 8, axis=1)
    decision = decide(
        estimates=_live(ms, own), view=_view(), load_weights={40: 1.0},
        settings=CHALLENGERS_MEASURED,
    )  # fmt: skip
    assert decision.new is not None
    before, after = dense_lookup(START, 128, 3), dense_lookup(decision.new, 128, 3)
    for b in range(1, 129):
        if after[b] != before[b]:
            new, old = (
                own[profile.ks.index(after[b]), b - 1],
                own[profile.ks.index(before[b]), b - 1],
            )
            assert new == 0 or new >= MEASURED_STEPS or old < MEASURED_STEPS, b
