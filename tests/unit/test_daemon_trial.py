"""Trials: a k that only neighbour bursts measured, put in as the table's k at the load's cell,
then settled against the table it replaced."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from bench.burst_drop_sim import k_at
from bench.live_step_time_sim import daemon_at
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune import __version__
from tabletune.admin.protocol import EngineIdentity, TableView
from tabletune.admin.state import TableState
from tabletune.daemon.alerts import AlertSink
from tabletune.daemon.apply import Applied
from tabletune.daemon.decide import Decision, Estimates, decide
from tabletune.daemon.metrics import DaemonMetrics
from tabletune.daemon.outcomes import Outcomes
from tabletune.daemon.oversold import StoodOn
from tabletune.daemon.plan import PlanInputs, PushTable, plan_replica
from tabletune.daemon.profiles import make_pool
from tabletune.daemon.runtime import CycleReport, ReplicaRuntime
from tabletune.daemon.settings import DaemonSettings, load_settings
from tabletune.daemon.state import DaemonState, StateStore
from tabletune.daemon.step_time import StepTimeLayout
from tabletune.daemon.trial import Trial, propose_trial, settle_due
from tabletune.schemas.table import dense_lookup
from tabletune.solver import StepTimes, tau
from tests.unit.daemon_fakes import replica_runtime, small_profile
from tests.unit.test_daemon_explore import h200_daemon_state

KS = (0, 1, 2, 3)
RATES = (0.75, 0.55, 0.40)  # tau = 1, 1.75, 2.30, 2.70
MAX_B = 256
LOAD = 127  # in the cell 121-128
TABLE = [[1, 128, 3], [129, 256, 1]]


def _estimates(
    ms: dict[int, float],
    *,
    sigma: float = 0.12,
    own: dict[int, float] | None = None,
    ran: dict[int, float] | None = None,
) -> Estimates:
    """Flat step times per k, one relative uncertainty, and per-k steps (all batch sizes)."""
    grid = tuple(range(1, MAX_B + 1))
    rows = np.vstack([np.full(MAX_B, ms[k]) for k in KS])
    own = own or {}
    ran = ran or {}
    return Estimates(
        step_times=StepTimes(grid=grid, ks=KS, ms=rows),
        rates=RATES,
        relative_sigma=np.full((len(KS), MAX_B), sigma),
        own_steps=np.vstack([np.full(MAX_B, own.get(k, 0.0)) for k in KS]),
        run_steps=np.vstack([np.full(MAX_B, ran.get(k, 0.0)) for k in KS]),
    )


def _view(table: list[list[int]] = TABLE) -> TableView:
    state = TableState.initial(table, num_speculative_tokens=3, max_num_seqs=MAX_B)
    return state.view(plugin_version=__version__, identity=EngineIdentity("0.26.0"))


# The H200's decode-heavy B≈127 (docs/results.md): k=1 running at 11.1 ms (its own run), k=2
# known from bursts alone at 17.2 ms ± 12 %, though it ran at 13.6 ms as a fixed arm.
H200_LIKE = {0: 10.9, 1: 11.1, 2: 17.2, 3: 21.4}
AFTER_MOVE = [[1, 120, 3], [121, 128, 1], [129, 168, 2], [169, 256, 1]]


def _propose(estimates: Estimates, view: TableView, *, z: float = 1.5) -> object:
    return propose_trial(
        estimates=estimates,
        view=view,
        load_weights={LOAD: 1.0},
        z=z,
        min_gain=0.01,
        trial_steps=100,
        min_width=5,
    )


def test_a_k_only_bursts_measured_is_tried_at_the_loads_cell() -> None:
    estimates = _estimates(H200_LIKE, own={1: 600, 2: 60, 3: 700}, ran={1: 550, 3: 700})
    trial = _propose(estimates, _view(AFTER_MOVE))
    assert trial is not None
    assert trial.push and trial.trial == (2, LOAD)  # type: ignore[attr-defined]
    lookup = dense_lookup(trial.new, MAX_B, 3)  # type: ignore[attr-defined]
    assert lookup[121:129] == [2] * 8  # the cell, and nothing else
    assert lookup[120] == 3 and lookup[129] == 2 and lookup[200] == 1
    assert "trial of k=2 at 121-128" in trial.reason  # type: ignore[attr-defined]


def test_one_standard_error_would_not_have_tried_it() -> None:
    # 17.2 ms x (1 - 0.12) = 15.1 ms: 2.30 / 15.1 = 0.152 per ms, k=1 0.158: the miss.
    estimates = _estimates(H200_LIKE, own={1: 600, 2: 60, 3: 700}, ran={1: 550, 3: 700})
    assert _propose(estimates, _view(AFTER_MOVE), z=1.0) is None


def test_a_k_tried_already_or_never_burst_is_not_tried() -> None:
    tried = _estimates(H200_LIKE, own={1: 600, 2: 300, 3: 700}, ran={1: 550, 2: 240, 3: 700})
    assert _propose(tried, _view(AFTER_MOVE)) is None
    unmeasured = _estimates(H200_LIKE, own={1: 600, 2: 12, 3: 700}, ran={1: 550, 3: 700})
    assert _propose(unmeasured, _view(AFTER_MOVE)) is None


def test_no_trial_without_load_live_step_time_or_a_dynamic_table() -> None:
    estimates = _estimates(H200_LIKE, own={1: 600, 2: 60}, ran={1: 550})
    assert (
        propose_trial(
            estimates=estimates,
            view=_view(AFTER_MOVE),
            load_weights={},
            z=1.5,
            min_gain=0.01,
            trial_steps=100,
        )
        is None
    )
    assert _propose(replace(estimates, run_steps=None), _view(AFTER_MOVE)) is None
    static = _view(AFTER_MOVE).model_copy(update={"dynamic": False, "table": None})
    assert _propose(estimates, static) is None


@given(
    st.dictionaries(st.sampled_from(KS), st.floats(5.0, 60.0), min_size=4, max_size=4),
    st.floats(0.0, 0.5),
    st.integers(1, MAX_B),
)
def test_a_trial_only_ever_changes_the_loads_cell_to_an_allowed_k_that_could_win(
    ms: dict[int, float], sigma: float, load: int
) -> None:
    estimates = _estimates(ms, sigma=sigma, own=dict.fromkeys(KS, 60.0))
    view = _view()
    trial = propose_trial(
        estimates=estimates,
        view=view,
        load_weights={load: 1.0},
        z=1.5,
        min_gain=0.01,
        trial_steps=100,
    )
    if trial is None:
        return
    assert trial.new is not None and trial.trial is not None
    k, batch = trial.trial
    before, after = dense_lookup(TABLE, MAX_B, 3), dense_lookup(trial.new, MAX_B, 3)
    changed = [b for b in range(1, MAX_B + 1) if before[b] != after[b]]
    assert batch == load and all(after[b] == k for b in changed) and k in view.allowed_k
    assert max(changed) - min(changed) < 8 and min(changed) <= load <= max(changed)
    hopeful = ms[k] * max(1 - 1.5 * sigma, 1e-9)
    assert tau(RATES, k) / hopeful > tau(RATES, before[load]) / ms[before[load]]


TRIAL_TABLE = [[1, 120, 3], [121, 128, 2], [129, 168, 2], [169, 256, 1]]


def _trial(started_at: float = 0.0) -> Trial:
    before = tuple(tuple(r) for r in AFTER_MOVE)
    return Trial(k=2, batch=LOAD, before=before, started_at=started_at)  # type: ignore[arg-type]


def test_a_trial_is_settled_once_its_k_ran_enough_steps() -> None:
    view = _view(TRIAL_TABLE)
    few, enough = _estimates(H200_LIKE, ran={2: 40}), _estimates(H200_LIKE, ran={2: 140})
    assert not settle_due(_trial(), few, view, now=10.0, trial_steps=100, max_s=60)
    assert settle_due(_trial(), enough, view, now=10.0, trial_steps=100, max_s=60)


def test_a_trial_that_cannot_run_its_steps_is_settled_anyway() -> None:
    few = _estimates(H200_LIKE, ran={2: 40})
    # The table was changed under it: its k no longer runs there.
    assert settle_due(_trial(), few, _view(AFTER_MOVE), now=10.0, trial_steps=100, max_s=60)
    # The load left its cell: its k gets no steps; the wait is bounded.
    assert settle_due(_trial(), few, _view(TRIAL_TABLE), now=61.0, trial_steps=100, max_s=60)


SETTLE = load_settings({}).decision


def _decide_on_trial(estimates: Estimates, *, settling: bool) -> Decision:
    """The decision with the trial's table running; ``settling``: against the one it replaced."""
    return decide(
        estimates=estimates,
        view=_view(TRIAL_TABLE),
        load_weights={LOAD: 1.0},
        settings=SETTLE,
        before_trial=[tuple(r) for r in AFTER_MOVE] if settling else None,  # type: ignore[misc]
    )


def test_a_trial_that_proved_itself_stays() -> None:
    # k=2 ran at 13.6 ms on its own: 2.30 / 13.6 = 0.169 against k=1's 0.158, beyond the noise.
    # (Flat step times make k=2 best everywhere: the settling decision may reshape the rest.)
    decision = _decide_on_trial(_estimates({**H200_LIKE, 2: 13.6}, sigma=0.02), settling=True)
    assert dense_lookup(decision.new or (), MAX_B, 3)[LOAD] == 2


def test_a_trial_within_the_noise_gives_the_table_back() -> None:
    # k=2 on its own run 2 % ahead of k=1, with 5 % uncertainty: not beyond the noise, so the
    # table it replaced comes back, though k=2 would hold on as the running k.
    estimates = _estimates({**H200_LIKE, 2: 14.3}, sigma=0.05)
    settled = _decide_on_trial(estimates, settling=True)
    assert settled.push and settled.reason == "trial ended"
    assert dense_lookup(settled.new or (), MAX_B, 3)[LOAD] == 1
    assert not _decide_on_trial(estimates, settling=False).push


POOL = make_pool(small_profile(), None)


def _runtime(**changes: object) -> ReplicaRuntime:
    return replica_runtime(POOL, load=LOAD, **changes)


def _plan_inputs(estimates: Estimates, view: TableView, **due: bool) -> PlanInputs:
    return PlanInputs(
        view=view,
        now=10_000.0,
        restart=False,
        estimates=estimates,
        load_weights={LOAD: 1.0},
        rates_moved=False,
        estimate_ready=True,
        step_time_moved=due.get("step_time_moved", False),
    )


def test_the_planner_lets_a_trial_run_then_settles_it() -> None:
    settings = load_settings({"TABLETUNE_DECISION__TRIALS": "true"})
    trial_table, trial = TRIAL_TABLE, _trial(started_at=10_000.0 - 5.0)
    running = _estimates({**H200_LIKE, 2: 14.3}, sigma=0.05, own={2: 50}, ran={2: 50})
    plan = plan_replica(
        _runtime(trial=trial),
        _plan_inputs(running, _view(trial_table), step_time_moved=True),
        settings=settings,
        dry_run=False,
    )
    assert plan.decision is None  # 50 of its 100 steps: it runs on
    ran = _estimates({**H200_LIKE, 2: 14.3}, sigma=0.05, own={2: 150}, ran={2: 150})
    plan = plan_replica(
        _runtime(trial=trial), _plan_inputs(ran, _view(trial_table)), settings=settings,
        dry_run=False,
    )  # fmt: skip
    assert plan.decision is not None and plan.decision.reason == "trial ended"
    assert any(isinstance(e, PushTable) for e in plan.effects)


def test_the_planner_starts_a_trial_only_when_trials_are_on() -> None:
    estimates = _estimates(H200_LIKE, own={1: 600, 2: 60, 3: 700}, ran={1: 550, 3: 700})
    inputs = _plan_inputs(estimates, _view(AFTER_MOVE), step_time_moved=True)
    off = plan_replica(_runtime(), inputs, settings=load_settings({}), dry_run=False)
    assert off.decision is not None and off.decision.trial is None
    on = plan_replica(
        _runtime(),
        inputs,
        settings=load_settings({"TABLETUNE_DECISION__TRIALS": "true"}),
        dry_run=False,
    )
    assert on.decision is not None and on.decision.trial == (2, LOAD)
    assert any(isinstance(e, PushTable) for e in on.effects)


def test_the_h200_miss_would_have_been_tried() -> None:
    # The recorded B≈127 daemon part through this checkout's estimator: k=1 running at 121-128,
    # k=2 known from 64 burst steps only. A trial at the default z puts k=2 in there.
    estimate, pool, rates, table = h200_daemon_state()
    columns = StepTimeLayout(pool.step_times, pool.step_times.max_batch).cell_of_batch
    estimates = Estimates(
        step_times=estimate.step_times,
        rates=rates,
        relative_sigma=estimate.relative_sigma,
        own_steps=estimate.measured[:, columns],
        run_steps=estimate.ran[:, columns],
    )
    view = _view([list(r) for r in table])
    defaults = load_settings({}).decision
    trial = propose_trial(
        estimates=estimates,
        view=view,
        load_weights={LOAD: 1.0},
        z=defaults.trial_z,
        min_gain=defaults.min_gain,
        trial_steps=defaults.trial_steps,
        min_width=5,
    )
    assert trial is not None and trial.trial == (2, LOAD)


def test_on_the_emulator_trials_settle_a_near_tie_that_bursts_left_on_the_wrong_k(
    tmp_path: Path,
) -> None:
    # serving-decode-heavy at B=120 (k=2 best, k=3 12 % behind and running from the profile's
    # table), each step drawn with a 0.6 relative spread: with bursts alone the daemon was
    # still on k=3 after two minutes in this seed; with trials it tried k=2, kept it, tried
    # k=1, gave it back (bench/burst_drop_sim.py weighs this over 80 runs).
    runs = {}
    for name, env in (("bursts", {}), ("trials", {"DECISION__TRIALS": "true"})):
        run = daemon_at(120, tmp_path / name, overrides={"seed": 103, "step_noise": 0.6}, **env)
        runs[name] = [k for _, k in run["table_k_by_time"]]
        assert k_at(run["oracle_table"], 120) == 2
    assert runs["bursts"][-1] == 3
    assert runs["trials"][-1] == 2 and 1 in runs["trials"]


def test_a_k_tried_lately_is_not_tried_again_when_a_shift_cleared_its_steps() -> None:
    # On the H200 the shift check cleared the cell's run counts in steady traffic, and the same
    # k were tried twice each within a minute; the retry window keeps a tried k out.
    settings = load_settings({"TABLETUNE_DECISION__TRIALS": "true"})
    cleared = _estimates(H200_LIKE, own={1: 600, 2: 60, 3: 700}, ran={1: 550, 3: 700})
    inputs = _plan_inputs(cleared, _view(AFTER_MOVE), step_time_moved=True)
    lately = settings.decision.trial_retry_s - 1.0
    within = plan_replica(
        _runtime(tried_at={(2, 121): inputs.now - lately}), inputs, settings=settings,
        dry_run=False,
    )  # fmt: skip
    assert within.decision is not None and within.decision.trial is None
    assert not any(isinstance(e, PushTable) for e in within.effects)
    other_cell = plan_replica(
        _runtime(tried_at={(2, 113): inputs.now - lately}), inputs, settings=settings,
        dry_run=False,
    )  # fmt: skip
    assert other_cell.decision is not None and other_cell.decision.trial == (2, LOAD)
    after = plan_replica(
        _runtime(tried_at={(2, 121): inputs.now - settings.decision.trial_retry_s}),
        inputs,
        settings=settings,
        dry_run=False,
    )
    assert after.decision is not None and after.decision.trial == (2, LOAD)


# The push that starts a trial of k=2 at the load, from the table after the move.
TRIAL_START = Decision(
    push=True, reason="trial", new=tuple(map(tuple, TRIAL_TABLE)),  # type: ignore[arg-type]
    current=tuple(map(tuple, AFTER_MOVE)), trial=(2, LOAD),  # type: ignore[arg-type]
)  # fmt: skip


def _outcomes(settings: DaemonSettings) -> Outcomes:
    sink = AlertSink(settings=settings.alerts, condition_ttl_s=60.0)
    return Outcomes(settings, DaemonMetrics(), sink)


def _pushed(outcomes: Outcomes, rt: ReplicaRuntime, decision: Decision, at: float) -> None:
    """``decision``'s push made at ``at`` (the engine took it)."""
    applied = Applied(view=_view(TRIAL_TABLE), done=[PushTable(decision)])
    outcomes.record(rt, applied, at, CycleReport(at))


def test_the_push_that_starts_a_trial_records_when_its_k_was_tried_there() -> None:
    outcomes = _outcomes(load_settings({"TABLETUNE_DECISION__TRIALS": "true"}))
    rt, start = _runtime(), TRIAL_START
    _pushed(outcomes, rt, start, 500.0)
    assert rt.trial is not None and rt.trial.k == 2
    assert rt.tried_at == {(2, 121): 500.0}
    _pushed(outcomes, rt, replace(start, reason="trial ended", trial=None), 510.0)
    assert rt.trial is None and rt.tried_at == {(2, 121): 500.0}


def test_a_push_putting_a_k_in_keeps_what_it_stood_on_and_a_trial_does_not() -> None:
    # daemon.oversold reads the k's run against it once the k has run there.
    outcomes, rt = _outcomes(load_settings({})), _runtime()
    push = replace(
        TRIAL_START, reason="predicted gain", trial=None, stood_on=StoodOn(2, LOAD, 17.2)
    )
    _pushed(outcomes, rt, push, 500.0)
    assert rt.stood_on == StoodOn(k=2, batch=LOAD, step_time=17.2, at=500.0)
    _pushed(outcomes, rt, replace(push, trial=(2, LOAD)), 510.0)
    assert rt.stood_on is None  # a trial is settled by its own rule


def test_a_trial_in_force_is_saved_and_a_restarted_daemon_settles_it(tmp_path: Path) -> None:
    rt = _runtime()
    rt.set_trial(_trial(started_at=9_000.0))
    store = StateStore(tmp_path)
    store.save(DaemonState(replicas={"r1": rt.record}))
    saved, problem = store.load()
    assert problem is None
    restored = replace(_runtime(), record=saved.replicas["r1"])  # as the controller builds it
    assert restored.trial == _trial(started_at=9_000.0)
    # The restarted daemon's first plan settles it (60 s are long past): the table it replaced
    # comes back unless the trial's k beat it beyond the noise.
    settings = load_settings({"TABLETUNE_DECISION__TRIALS": "true"})
    estimates = _estimates(H200_LIKE, own={1: 600, 2: 40, 3: 700}, ran={1: 550, 2: 40, 3: 700})
    plan = plan_replica(
        restored, _plan_inputs(estimates, _view(TRIAL_TABLE)), settings=settings, dry_run=False
    )
    assert plan.decision is not None and plan.decision.reason == "trial ended"
    assert dense_lookup(plan.decision.new or (), MAX_B, 3)[LOAD] == 1
    restored.set_trial(None)
    assert restored.record.trial is None


def test_when_a_k_was_tried_is_saved_and_a_restarted_daemon_does_not_try_it_again(
    tmp_path: Path,
) -> None:
    # Restarted inside the retry window, the daemon must not try the same k at the same cell
    # again on the bursts that the restart left it.
    settings = load_settings({"TABLETUNE_DECISION__TRIALS": "true"})
    rt = _runtime()
    _pushed(_outcomes(settings), rt, TRIAL_START, 9_500.0)
    rt.set_trial(None)  # settled before the restart
    store = StateStore(tmp_path)
    store.save(DaemonState(replicas={"r1": rt.record}))
    saved, problem = store.load()
    assert problem is None
    restored = replace(_runtime(), record=saved.replicas["r1"])  # as the controller builds it
    assert restored.tried_at == {(2, 121): 9_500.0}
    cleared = _estimates(H200_LIKE, own={1: 600, 2: 60, 3: 700}, ran={1: 550, 3: 700})
    inputs = _plan_inputs(cleared, _view(AFTER_MOVE), step_time_moved=True)
    plan = plan_replica(restored, inputs, settings=settings, dry_run=False)
    assert plan.decision is not None and plan.decision.trial is None
    fresh = plan_replica(_runtime(), inputs, settings=settings, dry_run=False)
    assert fresh.decision is not None and fresh.decision.trial == (2, LOAD)  # what it held off


@pytest.mark.parametrize(
    "at", [float("nan"), float("inf"), "soon"], ids=["nan", "inf", "not a number"]
)
def test_a_saved_tried_time_that_is_not_one_is_moved_aside_not_restored(
    tmp_path: Path, at: object
) -> None:
    store = StateStore(tmp_path)
    tried = [{"k": 2, "cell_from": 121, "at": at}]
    store.path.write_text(json.dumps({"replicas": {"r1": {"tried": tried}}}))
    fresh, problem = store.load()
    assert problem is not None and "moved aside" in problem
    assert fresh == DaemonState()


@pytest.mark.parametrize(
    "before",
    [[[1, 120]], [[1, 120, 3], [100, 256, 2]], [], [[0, 256, 3]]],
    ids=["not a range", "overlapping", "empty", "from 0"],
)
def test_a_saved_trial_whose_table_is_not_one_is_moved_aside_not_restored(
    tmp_path: Path, before: list[list[int]]
) -> None:
    # A hand-edited or damaged state file must not crash the restarted daemon when its
    # replicas come back: like any unusable state, it is reported and set aside.
    record = {"k": 2, "batch": LOAD, "before": before, "started_at": 9_000.0}
    store = StateStore(tmp_path)
    store.path.write_text(json.dumps({"replicas": {"r1": {"trial": record}}}))
    fresh, problem = store.load()
    assert problem is not None and "moved aside" in problem
    assert fresh == DaemonState()


TRIALS_ON = load_settings({"TABLETUNE_DECISION__TRIALS": "true"}).decision
# k=1 running at the load (its own run), k=2 known from 60 burst steps only, and on them far
# ahead beyond the noise: 2.30 / 9 ms against 1.75 / 11.1 ms.
BURSTS_SAY_K2 = {**H200_LIKE, 2: 9.0}


def _decide(
    estimates: Estimates, settings: object, table: list[list[int]] = AFTER_MOVE
) -> Decision:
    return decide(
        estimates=estimates,
        view=_view(table),
        load_weights={LOAD: 1.0},
        settings=settings,  # type: ignore[arg-type]
        min_width=5,
    )


def test_with_trials_on_bursts_alone_never_put_a_k_in_at_the_loads_cell() -> None:
    estimates = _estimates(BURSTS_SAY_K2, sigma=0.02, own={1: 600, 2: 60}, ran={1: 550})
    assert dense_lookup(_decide(estimates, SETTLE).new or (), MAX_B, 3)[LOAD] == 2  # trials off
    on = _decide(estimates, TRIALS_ON)
    assert dense_lookup(on.new or (), MAX_B, 3)[LOAD] == 1
    # The planner tries it instead: k=2 over the load's cell, as a trial.
    inputs = _plan_inputs(estimates, _view(AFTER_MOVE), step_time_moved=True)
    settings = load_settings({"TABLETUNE_DECISION__TRIALS": "true"})
    plan = plan_replica(_runtime(), inputs, settings=settings, dry_run=False)
    assert plan.decision is not None and plan.decision.trial == (2, LOAD)


def test_a_k_that_ran_its_trial_steps_is_judged_on_them() -> None:
    ran = _estimates(BURSTS_SAY_K2, sigma=0.02, own={1: 600, 2: 160}, ran={1: 550, 2: 100})
    assert dense_lookup(_decide(ran, TRIALS_ON).new or (), MAX_B, 3)[LOAD] == 2
    # A k with no step of its own rests on the profile and the other k, as before.
    unseen = _estimates(BURSTS_SAY_K2, sigma=0.02, own={1: 600}, ran={1: 550})
    assert dense_lookup(_decide(unseen, TRIALS_ON).new or (), MAX_B, 3)[LOAD] == 2


@given(
    st.dictionaries(st.sampled_from(KS), st.floats(5.0, 60.0), min_size=4, max_size=4),
    st.floats(0.0, 0.3),
    st.dictionaries(st.sampled_from(KS), st.floats(0.0, 400.0), min_size=4, max_size=4),
    st.dictionaries(st.sampled_from(KS), st.floats(0.0, 1.0), min_size=4, max_size=4),
)
def test_with_trials_on_the_loads_cell_changes_only_to_a_k_run_or_unseen_there(
    ms: dict[int, float],
    sigma: float,
    own: dict[int, float],
    run_share: dict[int, float],
) -> None:
    ran = {k: own[k] * run_share[k] for k in KS}
    decision = _decide(_estimates(ms, sigma=sigma, own=own, ran=ran), TRIALS_ON)
    before = dense_lookup(AFTER_MOVE, MAX_B, 3)[LOAD]
    after = dense_lookup(decision.new or AFTER_MOVE, MAX_B, 3)[LOAD]
    if after != before:
        assert own[after] <= ran[after] or ran[after] >= TRIALS_ON.trial_steps


def test_a_k_no_trial_may_take_again_yet_is_judged_on_its_bursts() -> None:
    # After a trial of it, a shift of traffic cleared its run; within the retry window only
    # its bursts can put it in (the emulator's shape change waited 600 s otherwise).
    estimates = _estimates(BURSTS_SAY_K2, sigma=0.02, own={1: 600, 2: 60}, ran={1: 550})
    decision = decide(
        estimates=estimates,
        view=_view(AFTER_MOVE),
        load_weights={LOAD: 1.0},
        settings=TRIALS_ON,
        min_width=5,
        recently_tried={(2, 121)},
    )
    assert dense_lookup(decision.new or (), MAX_B, 3)[LOAD] == 2


# Each example writes the state file with fsync: no per-example deadline (it is the disk's).
@settings(deadline=None)
@given(
    tried=st.dictionaries(
        st.tuples(st.integers(0, 3), st.sampled_from((1, 121, 249))),
        st.floats(0.0, 2e9),
        max_size=6,
    )
)
def test_when_each_k_was_tried_survives_the_state_file(tried: dict[tuple[int, int], float]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        rt = _runtime()
        for (k, low), at in tried.items():
            rt.note_tried(k, low, at)
        store = StateStore(Path(folder))
        store.save(DaemonState(replicas={"r1": rt.record}))
        saved, problem = store.load()
    assert problem is None
    restored = replace(_runtime(), record=saved.replicas["r1"])  # as the controller builds it
    assert restored.tried_at == tried
