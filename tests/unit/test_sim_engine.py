"""EngineSim counts as vLLM counts, within sampling error of the closed form."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune.plugin.bandit import NightjarLookup
from tabletune.plugin.step_timer import StepTimer
from tabletune.schemas import Profile, load_profile
from tabletune.sim.build import build_engine, start_engine_side
from tabletune.sim.engine import EngineSim, SimError, StepBatch
from tabletune.sim.scenario import Scenario, parse_scenario
from tabletune.solver import build_table, tau

REPO = Path(__file__).resolve().parents[2]
SAMPLE_PROFILE = REPO / "examples" / "sample-profile.json"
RATES = (0.8, 0.6, 0.4)


@pytest.fixture(scope="module")
def profile() -> Profile:
    return load_profile(SAMPLE_PROFILE)


def scenario(**overrides: Any) -> Scenario:
    data: dict[str, Any] = {
        "name": "test",
        "engine": {
            "num_speculative_tokens": 3,
            "max_num_seqs": 256,
            "starting_table": [[1, 16, 3], [17, 32, 1], [33, 256, 0]],
        },
        "load": {"kind": "constant", "batch_size": 8},
        "acceptance": {"kind": "constant", "rates": list(RATES)},
    }
    for key, value in overrides.items():
        if key == "engine":
            data["engine"] = {**data["engine"], **value}
        else:
            data[key] = value
    return parse_scenario(data, source="test")


def engine_for(profile: Profile, **overrides: Any) -> EngineSim:
    return build_engine(scenario(**overrides), profile, base_dir=REPO)


def within(observed: float, n: float, p: float, sigmas: float = 5.0) -> bool:
    return abs(observed - n * p) <= sigmas * math.sqrt(max(n * p * (1 - p), 1.0))


def test_constant_scenario_counters_match_the_closed_form(profile: Profile) -> None:
    engine = engine_for(profile, load={"kind": "constant", "batch_size": 8})
    engine.advance(60.0)
    c = engine.counters
    step_s = engine.step_time_s(8, 3)
    assert c.steps == math.ceil(60.0 / step_s - 1e-9)
    requests = c.steps * 8
    assert c.num_drafts == requests
    assert c.num_draft_tokens == 3 * requests
    assert list(c.draft_tokens_per_pos) == [requests] * 3
    for position, a in enumerate(RATES):
        assert within(c.accepted_per_pos[position], requests, a), (position, c.accepted_per_pos)
    assert c.num_accepted_tokens == int(c.accepted_per_pos.sum())
    assert c.generation_tokens == requests + c.num_accepted_tokens
    # Accepted per position is a prefix count: never increasing with the position.
    assert np.all(np.diff(c.accepted_per_pos) <= 0)


def test_table_k_per_batch_size_shapes_the_counters(profile: Profile) -> None:
    one = engine_for(profile, load={"kind": "constant", "batch_size": 20})  # k=1 range
    one.advance(10.0)
    c = one.counters
    assert c.num_draft_tokens == c.num_drafts == c.steps * 20
    assert list(c.draft_tokens_per_pos) == [c.steps * 20, 0, 0]
    assert c.accepted_per_pos[1] == c.accepted_per_pos[2] == 0
    assert within(c.accepted_per_pos[0], c.steps * 20, RATES[0])

    zero = engine_for(profile, load={"kind": "constant", "batch_size": 64})  # k=0 range
    zero.advance(10.0)
    assert zero.counters.num_drafts == 0 and zero.counters.num_draft_tokens == 0
    assert zero.counters.generation_tokens == zero.counters.steps * 64
    assert zero.counters.steps == math.ceil(10.0 / zero.step_time_s(64, 0) - 1e-9)


def test_exploration_runs_the_longest_captured_k_every_n_steps(profile: Profile) -> None:
    engine = engine_for(
        profile,
        load={"kind": "constant", "batch_size": 64},
        engine={"exploration_interval": 10},
    )
    controller = start_engine_side(scenario(engine={"exploration_interval": 10}), engine)
    engine.advance(5.0)
    c = engine.counters
    explored = c.steps // 10
    assert controller.exploration_steps == explored
    assert c.num_drafts == explored * 64
    assert list(c.draft_tokens_per_pos) == [explored * 64] * 3
    assert controller.view().exploration_steps == explored


def test_hysteresis_holds_k_while_the_load_hovers_at_an_edge(profile: Profile) -> None:
    hover = {
        "kind": "sweep",
        "batch_sizes": [15, 18, 15, 18],
        "dwell_s": 1.0,
    }
    plain = engine_for(profile, load=hover)
    start_engine_side(scenario(load=hover), plain)
    plain.advance(4.0)
    assert plain.counters.step_cells().keys() == {(3, 15, 15), (1, 17, 24)}

    held = engine_for(profile, load=hover, engine={"hysteresis": 3})
    start_engine_side(scenario(load=hover, engine={"hysteresis": 3}), held)
    held.advance(4.0)
    # k=3 from the start (B=15) is kept at B=18: within 3 of B=16, the last k=3 batch size.
    assert held.counters.step_cells().keys() == {(3, 15, 15), (3, 17, 24)}


def test_restart_resets_counters_and_waits_out_the_downtime(profile: Profile) -> None:
    engine = engine_for(profile)
    engine.advance(5.0)
    assert engine.counters.steps > 0
    restarted_at = engine.now
    engine.restart(downtime_s=2.0)
    assert engine.counters.steps == 0 and engine.running() == 0
    engine.advance(1.5)
    assert engine.counters.steps == 0
    engine.advance_to(restarted_at + 3.0)  # runs for the last 1.0 s only
    assert engine.counters.steps == math.ceil(1.0 / engine.step_time_s(8, 3) - 1e-9)


def test_custom_policy_sees_every_step_index_in_order(profile: Profile) -> None:
    seen: list[tuple[int, int]] = []

    def alternate(batch_size: int, step_index: int) -> int:
        seen.append((batch_size, step_index))
        return 3 if step_index % 2 else 0

    engine = build_engine(scenario(), profile, base_dir=REPO, choose_k=alternate)
    engine.advance(2.0)
    assert [i for _, i in seen] == list(range(len(seen)))
    assert {b for b, _ in seen} == {8}
    assert engine.counters.num_drafts == (len(seen) // 2) * 8


def test_policy_returning_k_above_big_k_is_refused(profile: Profile) -> None:
    engine = build_engine(scenario(), profile, base_dir=REPO, choose_k=lambda b, i: 4)
    with pytest.raises(SimError, match=r"outside 0\.\.K=3"):
        engine.advance(1.0)


def test_no_requests_means_no_steps(profile: Profile) -> None:
    engine = engine_for(
        profile,
        load={
            "kind": "steps",
            "steps": [{"at_s": 0, "batch_size": 0}, {"at_s": 3, "batch_size": 8}],
        },
    )
    engine.advance(3.0)
    assert engine.counters.steps == 0 and engine.now == pytest.approx(3.0)
    batch = engine.step()
    assert batch is not None and batch.steps == 1 and batch.batch_size == 8


def test_step_noise_keeps_the_mean_step_time(profile: Profile) -> None:
    engine = engine_for(profile, step_noise=0.2)
    batches = []
    engine.on_steps.append(batches.append)
    engine.advance(30.0)
    durations = np.concatenate([b.durations_s for b in batches])
    assert durations.std() > 0
    assert durations.mean() == pytest.approx(engine.step_time_s(8, 3), rel=0.02)


def test_same_seed_same_counts(profile: Profile) -> None:
    first, second = engine_for(profile, step_noise=0.1), engine_for(profile, step_noise=0.1)
    first.advance(10.0)
    second.advance(4.0)
    second.advance(6.0)
    assert first.counters.steps == second.counters.steps
    assert first.counters.num_drafts == second.counters.num_drafts


def test_acceptance_switch_changes_the_kept_share(profile: Profile) -> None:
    engine = engine_for(
        profile,
        load={"kind": "constant", "batch_size": 8},
        acceptance={
            "kind": "switch",
            "before": [0.8, 0.65, 0.5],
            "after": [0.55, 0.3, 0.15],
            "at_s": 20.0,
        },
    )
    engine.advance(20.0)
    before = engine.counters.accepted_per_pos.copy()
    drafts_before = engine.counters.num_drafts
    engine.advance(20.0)
    after = engine.counters.accepted_per_pos - before
    drafts_after = engine.counters.num_drafts - drafts_before
    assert within(before[2], drafts_before, 0.5)
    assert within(after[2], drafts_after, 0.15)


def test_truth_scores_the_running_table_against_the_oracle(profile: Profile) -> None:
    # At B=64 the starting table runs k=0, but k=1 pays even with low acceptance.
    rates = {"kind": "constant", "rates": [0.3, 0.1, 0.02]}
    load = {"kind": "constant", "batch_size": 64}
    engine = engine_for(profile, acceptance=rates, load=load, truth_interval_s=5.0)
    engine.advance(19.9)
    intervals = list(engine.history)
    assert len(intervals) == 3 and intervals[0].end_s == 5.0
    best_k, best_goodput = engine.best_k(64, (0.3, 0.1, 0.02))
    assert best_k == 1
    for interval in intervals:
        row = interval.as_dict()
        assert row["efficiency"] is not None and row["efficiency"] < 1.0
        assert row["oracle_goodput_tokens_per_s"] == pytest.approx(best_goodput, rel=0.01)


# -- step cells and the serving model ----------------------------------------------------------

DECODE_HEAVY = {
    "name": "decode-heavy",
    "prompt": {"kind": "lognormal", "median": 48, "sigma": 1.0, "max": 1024},
    "output": {"kind": "lognormal", "median": 320, "sigma": 0.6, "max": 2048},
}
PREFILL_HEAVY = {
    "name": "prefill-heavy",
    "prompt": {"kind": "lognormal", "median": 768, "sigma": 0.6, "max": 4096},
    "output": {"kind": "lognormal", "median": 160, "sigma": 0.5, "max": 1024},
}
SERVING = {"traffic": {"kind": "constant", "shape": DECODE_HEAVY}, "context_cost": 0.3}


def collect(engine: EngineSim) -> list[StepBatch]:
    batches: list[StepBatch] = []
    engine.on_steps.append(batches.append)
    return batches


@pytest.mark.parametrize("serving", [None, SERVING])
def test_step_cells_add_up_to_the_steps_run(profile: Profile, serving: Any) -> None:
    load = {"kind": "sweep", "batch_sizes": [5, 24, 130, 250], "dwell_s": 3.0}
    engine = engine_for(profile, load=load, serving=serving, step_noise=0.1)
    start_engine_side(
        scenario(load=load, serving=serving, engine={"exploration_interval": 7}), engine
    )
    batches = collect(engine)
    engine.advance(12.0)
    cells = engine.counters.step_cells()
    assert {(low, high) for _, low, high in cells} == {(5, 5), (17, 24), (129, 136), (249, 256)}
    c = engine.counters
    # Steps at another k than the step before (exploration, the sweep's table edges) are
    # counted apart, as the plugin does; every other step is in its cell.
    ks = np.concatenate([b.ks for b in batches])
    switch = np.concatenate(([False], ks[1:] != ks[:-1]))
    durations = np.concatenate([b.durations_s for b in batches])
    tokens = np.concatenate([b.scheduled_tokens for b in batches])
    batch = np.concatenate([np.full(b.steps, b.batch_size) for b in batches])
    assert switch.any() and c.switch_steps == int(switch.sum())
    assert c.switch_seconds == pytest.approx(durations[switch].sum())
    steps = sum(t.steps for t in cells.values())
    assert steps + c.switch_steps + c.steps_without_decode == c.steps == ks.size
    keep = ~switch
    assert sum(t.requests for t in cells.values()) == batch[keep].sum()
    assert sum(t.seconds for t in cells.values()) == pytest.approx(durations[keep].sum())
    assert sum(t.seconds_sq for t in cells.values()) == pytest.approx((durations[keep] ** 2).sum())
    assert sum(t.tokens for t in cells.values()) == tokens[keep].sum()
    decode = batch * (1 + ks)
    assert np.all(tokens >= decode)
    assert np.any(tokens > decode) == (serving is not None)
    for (k, low, high), totals in cells.items():
        mine = keep & (ks == k) & (batch >= low) & (batch <= high)
        assert totals.steps == int(mine.sum())
        assert totals.requests == int(batch[mine].sum())
    # The plugin's own timer, handed the same steps as vLLM hands them (a step verifies the
    # drafts the step before made, the k that step read; it drafts the k it read), counts the
    # same cells and switch steps.
    timer = replayed_through_the_plugin(ks, durations, tokens, batch)
    assert timer.counter.switch_steps == c.switch_steps
    assert timer.counter.switch_seconds == pytest.approx(c.switch_seconds)
    plugin_cells = timer.counter.totals()
    assert plugin_cells.keys() == cells.keys()
    for key, totals in cells.items():
        mine = plugin_cells[key]
        assert (mine.steps, mine.tokens, mine.requests) == (
            totals.steps, totals.tokens, totals.requests,
        )  # fmt: skip
        assert mine.seconds == pytest.approx(totals.seconds)


def replayed_through_the_plugin(
    ks: np.ndarray, durations: np.ndarray, tokens: np.ndarray, batch: np.ndarray
) -> StepTimer:
    """The emulator's steps through the plugin's ``StepTimer``: a prefill-only call first (the
    timer's first call only starts its clock, the emulator times its first step), then each
    step with the drafts it verified (the k the step before read) and made (its own k)."""
    timer = StepTimer(started_at=0.0)
    timer.on_step(0.0, {"p": 64}, 64, {}, idle_after=False, drafts_next=int(ks[0]))
    now, verified = 0.0, int(ks[0])
    for k, seconds, total, size in zip(ks, durations, tokens, batch, strict=True):
        now += float(seconds)
        decodes = {f"r{i}": 1 + verified for i in range(int(size) - 1)}
        last = max(1 + verified, int(total) - sum(decodes.values()))  # prefill rides on one
        scheduled = decodes | {"last": last}
        spec = {r: [-1] * verified for r in scheduled} if verified else {}
        timer.on_step(now, scheduled, int(total), spec, idle_after=False, drafts_next=int(k))
        verified = int(k)
    return timer


def test_without_serving_the_truth_is_the_profile(profile: Profile) -> None:
    engine = engine_for(profile)
    for batch, k in [(1, 0), (17, 1), (128, 3), (256, 2)]:
        assert engine.true_step_s(batch, k) == engine.step_time_s(batch, k)
    table = build_table(engine.step_times, RATES, allowed_k={0, 1, 3}, max_batch=256)
    assert engine.oracle_table().ranges == table.ranges


def test_serving_truth_is_the_model_not_the_profile(profile: Profile) -> None:
    engine = engine_for(
        profile,
        load={"kind": "constant", "batch_size": 128},
        acceptance={"kind": "constant", "rates": [0.75, 0.55, 0.4]},
        engine={"starting_table": [[1, 64, 3], [65, 128, 2], [129, 256, 1]]},
        serving=SERVING,
    )
    rates = (0.75, 0.55, 0.4)
    # B=128: k=3 fills the 512-token graphs with decode alone, so any prefill leaves them.
    assert engine.true_step_s(128, 3) > 1.5 * engine.step_time_s(128, 3)
    assert engine.true_step_s(128, 2) < 1.5 * engine.step_time_s(128, 2)
    profile_k = max((3, 2, 1), key=lambda k: tau(rates, k) / engine.step_time_s(128, k))
    assert profile_k == 3
    assert engine.best_k(128, rates)[0] == 2
    assert engine.oracle_table().per_batch_k[127] == 2
    grid = engine.true_step_times()
    assert grid.at(128, 3) == pytest.approx(1000 * engine.true_step_s(128, 3))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_emulated_steps_average_to_the_true_step_time(profile: Profile, k: int) -> None:
    """What the daemon will measure live (cell seconds / steps) is what the oracle scores."""
    engine = build_engine(
        scenario(load={"kind": "constant", "batch_size": 128}, serving=SERVING),
        profile,
        base_dir=REPO,
        choose_k=lambda b, i: k,
    )
    engine.advance(300.0)
    (totals,) = engine.counters.step_cells().values()
    error = math.sqrt(totals.variance_s2 / totals.steps)
    assert abs(totals.mean_s - engine.true_step_s(128, k)) < 5 * error


def test_traffic_shape_switches_mid_run(profile: Profile) -> None:
    traffic = {"kind": "switch", "before": DECODE_HEAVY, "after": PREFILL_HEAVY, "at_s": 5.0}
    engine = engine_for(
        profile,
        load={"kind": "constant", "batch_size": 96},
        serving={"traffic": traffic},
    )
    batches = collect(engine)
    engine.advance(10.0)
    assert not any(b.start_s < 5.0 < b.end_s - b.durations_s[-1] for b in batches)
    before = [b for b in batches if b.start_s < 5.0]
    after = [b for b in batches if b.start_s >= 5.0]
    mean_tokens = [
        np.mean(np.concatenate([b.scheduled_tokens for b in part])) for part in (before, after)
    ]
    assert mean_tokens[1] > 3 * mean_tokens[0]
    assert engine.shape(4.9).name == "decode-heavy" and engine.shape().name == "prefill-heavy"
    assert engine.true_step_s(96, 3) > 2 * engine.true_step_s(96, 3, shape=engine.shape(0.0))


@pytest.mark.parametrize("serving", [None, SERVING])
@pytest.mark.parametrize("noise", [0.0, 0.15])
def test_batched_and_per_step_paths_agree(profile: Profile, noise: float, serving: Any) -> None:
    """A plain lookup list runs steps in one go; a policy callable step by step. Same steps."""
    load = {"kind": "sweep", "batch_sizes": [8, 24, 130], "dwell_s": 2.0}
    batched = engine_for(profile, load=load, step_noise=noise, serving=serving)
    table = list(batched.lookup)  # type: ignore[arg-type]
    stepped = build_engine(
        scenario(load=load, step_noise=noise, serving=serving),
        profile,
        base_dir=REPO,
        choose_k=lambda b, i: table[b],
    )
    for engine in (batched, stepped):
        engine.advance(3.0)
        engine.advance(4.5)
    assert batched.counters.steps == stepped.counters.steps
    assert batched.counters.num_drafts == stepped.counters.num_drafts
    assert batched.counters.num_draft_tokens == stepped.counters.num_draft_tokens
    assert batched.now == stepped.now
    assert batched.counters.step_cells() == stepped.counters.step_cells()


def test_serving_same_seed_same_steps_however_the_run_is_cut(profile: Profile) -> None:
    first = engine_for(profile, step_noise=0.1, serving=SERVING)
    second = engine_for(profile, step_noise=0.1, serving=SERVING)
    first.advance_to(10.0)
    for cut in range(1, 8):
        second.advance_to(10.0 * cut / 7)  # a scrape now and then
    (one,), (other,) = (e.counters.step_cells().values() for e in (first, second))
    assert (one.steps, one.tokens, one.requests) == (other.steps, other.tokens, other.requests)
    assert one.seconds == pytest.approx(other.seconds, rel=1e-12)  # summed in other groups
    assert first.now == pytest.approx(second.now, rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    batch=st.integers(1, 256),
    k=st.integers(0, 3),
    seed=st.integers(0, 2**16),
    shape=st.sampled_from([DECODE_HEAVY, PREFILL_HEAVY]),
)
def test_serving_steps_are_positive_and_schedule_at_least_the_decode_tokens(
    profile: Profile, batch: int, k: int, seed: int, shape: dict[str, Any]
) -> None:
    engine = build_engine(
        scenario(
            load={"kind": "constant", "batch_size": batch},
            serving={"traffic": {"kind": "constant", "shape": shape}},
            seed=seed,
        ),
        profile,
        base_dir=REPO,
        choose_k=lambda b, i: k,
    )
    batches = collect(engine)
    engine.advance(0.5)
    tokens = np.concatenate([b.scheduled_tokens for b in batches])
    durations = np.concatenate([b.durations_s for b in batches])
    assert np.all(durations > 0)
    assert np.all(tokens >= batch * (1 + k))
    assert np.all(tokens <= 8192)


@pytest.mark.parametrize(("load", "best"), [(8, 3), (200, 1)])
def test_the_nightjar_policy_learns_the_best_captured_k_in_the_emulator(
    profile: Profile, load: int, best: int
) -> None:
    constant = {"kind": "constant", "batch_size": load}
    low = {"kind": "constant", "rates": [0.3, 0.1, 0.05]}  # k=3 best at B=8, k=1 at B=200
    engine = engine_for(profile, load=constant, acceptance=low, step_noise=0.05)
    controller = start_engine_side(scenario(load=constant, acceptance=low), engine)
    answer = controller.put_settings({"policy": "nightjar", "nightjar_exploration": 0.3}, None)
    assert answer["status"] == 200
    bandit = engine.lookup
    assert isinstance(bandit, NightjarLookup)
    engine.advance(60.0)
    assert engine.best_k(load, (0.3, 0.1, 0.05))[0] == best
    assert bandit.table_k(load) == best
    cells = engine.counters.step_cells()
    assert controller.view().nightjar_steps == engine.counters.steps == bandit.steps
    # It learnt from exactly the steps in the cells (switch steps are not).
    assert bandit.rewarded_steps == sum(int(t.steps) for t in cells.values())
    assert engine.counters.switch_steps > 0
    steps_at = {key[0]: totals.steps for key, totals in cells.items()}
    assert max(steps_at, key=steps_at.__getitem__) == best  # it mostly runs the best k
