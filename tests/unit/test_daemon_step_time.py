"""The live step-time estimate: prior blending, borrowing across k, fading, uncertainty."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune.daemon.step_time import (
    StepTimeEstimator,
    StepTimeLayout,
    StepTimeParams,
)
from tabletune.solver import StepTimes
from tabletune.step_cells import CellTotals, StepCellCounter

GRID = (1, 8, 16, 24, 32, 64, 128, 136, 256)
KS = (0, 1, 2, 3)


def _profile() -> StepTimes:
    base = np.array([4.5, 5.0, 5.5, 6.0, 6.5, 8.0, 10.0, 11.0, 20.0])
    return StepTimes(grid=GRID, ks=KS, ms=np.vstack([base * (1 + 0.05 * k) for k in KS]))


PROFILE = _profile()
PARAMS = StepTimeParams(prior_steps=100.0, half_life_s=60.0, correlation=1.0)


def _steps(k: int, batches: list[int], factor: float, *, repeat: int = 1) -> dict:
    """Cells of steps at these batch sizes running ``factor`` x the profile."""
    counter = StepCellCounter()
    for _ in range(repeat):
        for b in batches:
            counter.record(
                batch_size=b, k=k, duration_s=factor * PROFILE.at(b, k) / 1000.0, tokens=b * 4
            )
    return counter.totals()


def _estimator(max_batch: int = 256) -> StepTimeEstimator:
    return StepTimeEstimator(StepTimeLayout(PROFILE, max_batch))


def test_without_live_data_the_estimate_is_the_profile_with_the_prior_spread() -> None:
    estimate = _estimator().estimate(PARAMS)
    assert np.allclose(estimate.step_times.ms, PROFILE.dense(256))
    assert np.allclose(estimate.relative_sigma, PARAMS.prior_sigma)
    assert estimate.observed(min_steps=1e-9) == ()
    assert np.all(np.isnan(estimate.live_ratio)) and not estimate.steps.any()


def test_live_steps_at_the_profile_give_ratio_one_even_across_a_cell_with_a_slope() -> None:
    # B = 129..136 straddles nothing (the grid has 128 and 136): T is linear inside the cell,
    # so mixing batch sizes inside it must still compare exactly.
    estimator = _estimator()
    estimator.add(_steps(3, [129, 130, 136, 136], 1.0, repeat=50), now=0.0, half_life_s=60.0)
    estimate = estimator.estimate(PARAMS)
    [cell] = estimate.observed(min_steps=1)
    assert cell.cell == (129, 136)
    assert cell.live_ratio == pytest.approx(1.0, abs=1e-12)
    # Where the load ran, T_hat is the profile at the batch size it ran at (132.75 on
    # average), flat over the cell; elsewhere the profile itself.
    dense = PROFILE.dense(256)
    outside = np.r_[0:128, 136:256]
    assert np.allclose(estimate.step_times.ms[:, outside], dense[:, outside])
    ran_at = np.array([np.interp(132.75, GRID, PROFILE.ms[i]) for i in range(len(KS))])
    assert np.allclose(estimate.step_times.ms[:, 128:136], ran_at[:, None])


def test_profile_wiggles_inside_a_cell_where_the_load_ran_do_not_flip_k() -> None:
    # A noisy profile cell at B=24 (k=2 looks 20 % slower there only). Where the load ran
    # (17-24, at B=20) every k is read at B=20 and held across the cell, so the noisy point
    # does not decide k at B=21..24.
    ms = PROFILE.ms.copy()
    ms[2, GRID.index(24)] *= 1.2
    noisy = StepTimes(grid=GRID, ks=KS, ms=ms)
    estimator = StepTimeEstimator(StepTimeLayout(noisy, 256))
    counter = StepCellCounter()
    for _ in range(100):
        for k in (2, 3):
            counter.record(batch_size=20, k=k, duration_s=noisy.at(20, k) / 1e3, tokens=80)
    estimator.add(counter.totals(), now=0.0, half_life_s=60.0)
    t = estimator.estimate(PARAMS).step_times
    assert [t.at(b, 2) for b in range(17, 25)] == pytest.approx([noisy.at(20, 2)] * 8)


def test_a_cost_seen_on_one_k_is_borrowed_by_the_unobserved_k_of_the_same_cell() -> None:
    estimator = _estimator()
    estimator.add(_steps(3, [128] * 4, 1.3, repeat=500), now=0.0, half_life_s=60.0)
    estimate = estimator.estimate(PARAMS)
    by_key = {
        (k, cell): estimate.cell(i, j)
        for i, k in enumerate(estimate.ks)
        for j, cell in enumerate(estimate.cells)
    }
    observed = by_key[(3, (121, 128))]
    unobserved = by_key[(2, (121, 128))]
    assert observed.ratio == pytest.approx((100 * unobserved.ratio + 2000 * 1.3) / 2100)
    assert unobserved.ratio == pytest.approx((100 + 2000 * 1.3) / 2100)
    assert unobserved.ratio > 1.25
    # elsewhere nothing moved
    assert by_key[(2, (1, 1))].ratio == 1.0


def test_a_cost_is_not_borrowed_across_cuda_graph_modes_of_the_profile() -> None:
    # H200, chat-like traffic at B~190: every live step carries prefill and runs off the full
    # graph whatever k. The profile timed k=0/1 on full graphs and k=2/3 past the capture limit
    # (eager, ~2.5x slower). Live k=1 runs 2.5x its full-graph profile, live k=3 only 1.4x its
    # eager one: a ratio seen on full-graph cells says nothing about the eager ones.
    off_graph = np.zeros((len(KS), len(GRID)), dtype=bool)
    off_graph[2:, GRID.index(136) :] = True  # k=2, 3 from B=136 on
    layout = StepTimeLayout(PROFILE, 256, off_graph=off_graph)
    estimator = StepTimeEstimator(layout)
    estimator.add(_steps(1, [136] * 4, 2.5, repeat=500), now=0.0, half_life_s=60.0)
    estimate = estimator.estimate(PARAMS)
    # k=0 (full graph, like the observed k=1) borrows the cost; k=2, 3 (eager) do not
    assert estimate.step_times.at(136, 0) / PROFILE.at(136, 0) > 2.3
    for k in (2, 3):
        assert estimate.step_times.at(136, k) == pytest.approx(PROFILE.at(136, k))
    # below the limit every k is on a full graph: borrowing as before
    estimator.add(_steps(1, [128] * 4, 2.5, repeat=500), now=0.0, half_life_s=60.0)
    assert estimator.estimate(PARAMS).step_times.at(128, 3) / PROFILE.at(128, 3) > 2.3


def test_the_graph_modes_must_match_the_profile_grid() -> None:
    with pytest.raises(ValueError, match="off_graph"):
        StepTimeLayout(PROFILE, 256, off_graph=np.zeros((len(KS), 3), dtype=bool))


def test_k_specific_slowness_shows_once_that_k_is_observed() -> None:
    estimator = _estimator()
    estimator.add(_steps(3, [128], 1.48, repeat=3000), now=0.0, half_life_s=60.0)
    estimator.add(_steps(2, [128], 1.10, repeat=1000), now=0.0, half_life_s=60.0)
    estimate = estimator.estimate(PARAMS)
    t3 = estimate.step_times.at(128, 3)
    t2 = estimate.step_times.at(128, 2)
    assert t3 / PROFILE.at(128, 3) == pytest.approx(1.48, rel=0.01)
    assert t2 / PROFILE.at(128, 2) == pytest.approx(1.10, rel=0.05)


def test_live_sums_fade_with_the_half_life() -> None:
    estimator = _estimator()
    estimator.add(_steps(1, [10], 2.0, repeat=400), now=0.0, half_life_s=60.0)
    estimator.add({}, now=120.0, half_life_s=60.0)
    [cell] = estimator.estimate(PARAMS).observed(min_steps=1)
    assert cell.steps == pytest.approx(100.0)
    assert cell.live_ratio == pytest.approx(2.0)


def test_cells_outside_the_profile_are_counted_not_used() -> None:
    estimator = _estimator(max_batch=64)
    outside = estimator.add(
        {(7, 5, 5): CellTotals(1, 0.01, 0.0001, 5, 5), (1, 65, 72): CellTotals(1, 0.01, 1, 1, 65)},
        now=0.0,
        half_life_s=60.0,
    )
    assert outside == 2
    assert estimator.estimate(PARAMS).observed(min_steps=0.5) == ()


def test_noisy_steps_give_a_wider_estimate_than_steady_ones() -> None:
    steady, noisy = _estimator(), _estimator()
    steady.add(_steps(2, [40], 1.0, repeat=2000), now=0.0, half_life_s=60.0)
    counter = StepCellCounter()
    for i in range(2000):
        factor = 0.7 if i % 2 else 1.3
        counter.record(batch_size=40, k=2, duration_s=factor * PROFILE.at(40, 2) / 1e3, tokens=1)
    noisy.add(counter.totals(), now=0.0, half_life_s=60.0)
    cell = (2, (33, 40))

    def sigma(estimator: StepTimeEstimator) -> float:
        estimate = estimator.estimate(PARAMS)
        return estimate.cell(estimate.ks.index(cell[0]), estimate.cells.index(cell[1])).sigma

    assert sigma(noisy) > 2 * sigma(steady)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(KS),
            st.integers(min_value=1, max_value=256),
            st.floats(min_value=0.5, max_value=3.0),
            st.integers(min_value=1, max_value=300),
        ),
        max_size=12,
    )
)
def test_estimate_stays_between_the_prior_and_the_live_extremes(
    runs: list[tuple[int, int, float, int]],
) -> None:
    estimator = _estimator()
    factors = [1.0]
    for k, b, factor, repeat in runs:
        estimator.add(_steps(k, [b], factor, repeat=repeat), now=0.0, half_life_s=60.0)
        factors.append(factor)
    estimate = estimator.estimate(PARAMS)
    assert np.all(estimate.ratio >= min(factors) - 1e-9)
    assert np.all(estimate.ratio <= max(factors) + 1e-9)
    assert np.all(estimate.step_times.ms > 0)
    assert np.all(estimate.relative_sigma > 0)


def test_a_shift_of_the_running_k_makes_the_other_k_of_its_cell_unmeasured_again() -> None:
    estimator = _estimator()
    estimator.add(
        {**_steps(3, [128], 1.0, repeat=1000), **_steps(2, [128], 1.0, repeat=1000)},
        now=0.0,
        half_life_s=60.0,
        shift=0.15,
    )
    # Same traffic, another cycle: nothing forgotten.
    estimator.add(_steps(3, [128], 1.02, repeat=500), now=1.0, half_life_s=1e9, shift=0.15)
    steps = estimator.estimate(PARAMS).steps
    assert steps[2, :].sum() == pytest.approx(1000, rel=1e-6)
    assert estimator.shifted_at is None
    # Longer prompts: k=3 now runs 1.6x; k=2 was not seen since, its old times no longer hold.
    estimator.add(_steps(3, [128], 1.6, repeat=500), now=2.0, half_life_s=1e9, shift=0.15)
    assert estimator.shifted_at == 2.0  # the push guard's samples before it are other traffic
    estimate = estimator.estimate(PARAMS)
    assert estimate.steps[2, :].sum() < 30  # below the exploration bar: tried afresh
    assert estimate.steps[3, :].sum() == pytest.approx(0.02 * 1500 + 500, rel=1e-6)
    # Other batch cells keep what they knew.
    estimator.add(_steps(1, [10], 1.0, repeat=300), now=3.0, half_life_s=1e9, shift=0.15)
    estimator.add(_steps(3, [128], 1.6, repeat=300), now=4.0, half_life_s=1e9, shift=0.15)
    assert estimator.estimate(PARAMS).steps[1, :].sum() == pytest.approx(300, rel=1e-6)


def test_a_k_that_ran_a_cell_while_its_traffic_settled_and_stopped_is_measured_afresh() -> None:
    # The H200's change from decode-heavy to chat-like at 192 clients (2026-12-01 19:43): the
    # 10 s after the change ran 30-40 % slow for every k (the engine core at 100 % CPU, the GPU
    # 54-76 % busy); k=3, put in then, read 55 ms where its arm ran 39 ms, was taken out and
    # never run again. settle_s after a shift, what a k showed while it ran the cell, and
    # runs it no more, is forgotten once more.
    estimator = _estimator()
    col = estimator.layout.cells.index((121, 128))
    estimator.add(_steps(1, [128], 1.0, repeat=1000), now=0.0, half_life_s=1e9, shift=0.15)
    estimator.add(_steps(1, [128], 1.6, repeat=300), now=3.0, half_life_s=1e9, shift=0.15,
                  settle_s=10.0)  # fmt: skip
    # k=3 runs in the transient, slow; still within settle_s of the shift: kept.
    estimator.add(_steps(3, [128], 2.4, repeat=60), now=6.0, half_life_s=1e9, shift=0.15,
                  settle_s=10.0)  # fmt: skip
    assert estimator.estimate(PARAMS).measured[3, col] == pytest.approx(60)
    # k=1 runs the cell again, k=2 in bursts beside it (the same seconds).
    estimator.add({**_steps(1, [128], 1.6, repeat=100), **_steps(2, [128], 2.0, repeat=20)},
                  now=9.0, half_life_s=1e9, shift=0.15, settle_s=10.0)  # fmt: skip
    # settle_s after the shift: what k=3 showed while it ran the cell is forgotten (kept at
    # 2 %) before the new interval's steps count; unmeasured again, the bursts try it afresh.
    # The running k keeps its steps (fresh ones keep coming to dilute its transient), and
    # what the bursts showed beside it stays.
    estimator.add(_steps(1, [128], 1.6, repeat=100), now=13.0, half_life_s=1e9, shift=0.15,
                  settle_s=10.0)  # fmt: skip
    estimate = estimator.estimate(PARAMS)
    assert estimate.measured[3, col] == 0 and estimate.steps[3, col] == pytest.approx(0.02 * 60)
    assert estimate.measured[1, col] == pytest.approx(300 + 100 + 100)
    assert estimate.measured[2, col] == pytest.approx(20)
    assert estimate.unproven[3, 120:128].all()  # still after a shift: k=3 leans on k=1
    # Once only: the cell's later cycles keep what they measure.
    estimator.add(_steps(3, [128], 1.6, repeat=60), now=16.0, half_life_s=1e9, shift=0.15,
                  settle_s=10.0)  # fmt: skip
    estimator.add(_steps(1, [128], 1.6, repeat=100), now=40.0, half_life_s=1e9, shift=0.15,
                  settle_s=10.0)  # fmt: skip
    assert estimator.estimate(PARAMS).measured[3, col] == pytest.approx(60)


@pytest.mark.parametrize("settle_s", [15.0, 0.0])
def test_the_cells_own_change_of_running_k_is_not_read_as_a_shift_while_it_settles(
    settle_s: float,
) -> None:
    # The H200's decode-heavy B≈254 part at e5e4c6f (03:38): k=1 pushed at 38 s, rolled back
    # at 47 s; 4.7 s later k=0's steps, amid the requests k=1's run had finished, read as a
    # change of traffic, and what k=1's run had shown was forgotten. Its requests finish, and
    # prompts arrive, at the running k's pace: the traffic moves when that k does.
    estimator = _estimator()
    col = estimator.layout.cells.index((121, 128))

    def add(k: int, factor: float, now: float) -> None:
        estimator.add(_steps(k, [128], factor, repeat=300 if now else 1000), now=now,
                      half_life_s=1e9, shift=0.15, settle_s=settle_s)  # fmt: skip

    add(0, 1.0, 0.0)
    add(1, 1.0, 3.0)  # pushed
    add(0, 1.3, 6.0)  # rolled back: k=0 amid k=1's wake
    assert estimator.shifted_at == (None if settle_s else 6.0)
    assert estimator.estimate(PARAMS).measured[1, col] == (300 if settle_s else 0)
    if settle_s:  # settled, the same k moving is the traffic's again
        add(0, 1.3, 15.0)
        assert estimator.shifted_at is None
        add(0, 2.0, 22.0)
        assert estimator.shifted_at == 22.0


def test_without_a_shift_or_with_settle_off_nothing_is_forgotten_after_it() -> None:
    for settle_s, traffic in ((10.0, 1.0), (0.0, 1.6)):
        estimator = _estimator()
        col = estimator.layout.cells.index((121, 128))
        estimator.add(_steps(1, [128], 1.0, repeat=1000), now=0.0, half_life_s=1e9, shift=0.15)
        for now in (3.0, 6.0, 30.0, 60.0):
            step = _steps(1, [128], traffic, repeat=300)
            step.update(_steps(3, [128], traffic, repeat=40) if now == 3.0 else {})
            estimator.add(step, now=now, half_life_s=1e9, shift=0.15, settle_s=settle_s)
        assert estimator.estimate(PARAMS).measured[3, col] == pytest.approx(40)


def test_a_k_stays_measured_while_its_steps_fade_until_the_cell_loses_sight_of_its_traffic() -> (
    None
):
    # k=2 ran 40 steps once (a neighbour burst's worth), k=3 runs every cycle: k=2's steps fade
    # under the exploration bar, but what they showed still holds while the cell's traffic is
    # watched (the running k keeps enough steps for a shift to be seen).
    estimator = _estimator()
    estimator.add(
        {**_steps(3, [128], 1.0, repeat=500), **_steps(2, [128], 1.5, repeat=40)},
        now=0.0,
        half_life_s=60.0,
        shift=0.15,
    )
    for minute in range(1, 6):
        estimator.add(_steps(3, [128], 1.0, repeat=300), now=60.0 * minute, half_life_s=60.0)
    estimate = estimator.estimate(PARAMS)
    col = estimate.cells.index((121, 128))
    assert estimate.steps[2, col] < 30 <= estimate.measured[2, col] == pytest.approx(40)
    assert estimate.measured[3, col] == pytest.approx(500 + 5 * 300)
    # The load leaves the cell: once its steps are too few to see a change of traffic, what
    # its k showed is no longer vouched for.
    estimator.add({}, now=60.0 * 5 + 600.0, half_life_s=60.0)
    assert not estimator.estimate(PARAMS).measured[:, col].any()


def test_a_shift_of_the_traffic_and_a_restart_drop_what_counted_as_measured() -> None:
    estimator = _estimator()
    estimator.add(
        {**_steps(3, [128], 1.0, repeat=1000), **_steps(2, [128], 1.0, repeat=1000)},
        now=0.0,
        half_life_s=1e9,
        shift=0.15,
    )
    estimator.add(_steps(3, [128], 1.6, repeat=500), now=1.0, half_life_s=1e9, shift=0.15)
    measured = estimator.estimate(PARAMS).measured
    col = estimator.layout.cells.index((121, 128))
    assert measured[2, col] == 0 and measured[3, col] == pytest.approx(500)
    estimator.clear()
    assert not estimator.estimate(PARAMS).measured.any()


def test_after_a_shift_a_k_leaning_on_other_k_live_steps_is_unproven_where_they_ran() -> None:
    estimator = _estimator()
    estimator.add(
        {**_steps(3, [128], 1.0, repeat=1000), **_steps(1, [10], 1.0, repeat=300)},
        now=0.0,
        half_life_s=1e9,
        shift=0.15,
    )
    # Steady traffic: an unobserved k borrows what the others show and may be decided on.
    assert not estimator.estimate(PARAMS).unproven.any()
    # Long prompts: k=3 runs 2x now. The other k of B 121..128 lean on that alone.
    estimator.add(_steps(3, [128], 2.0, repeat=500), now=1.0, half_life_s=1e9, shift=0.15)
    unproven = estimator.estimate(PARAMS).unproven
    assert unproven.shape == (len(KS), 256)
    assert unproven[:3, 120:128].all() and not unproven[3, 120:128].any()
    assert not np.delete(unproven, np.s_[120:128], axis=1).any()
    # k=2 measured as many steps as the prior weighs (w = 100): its own evidence leads.
    estimator.add(_steps(2, [128], 2.0, repeat=100), now=2.0, half_life_s=1e9, shift=0.15)
    unproven = estimator.estimate(PARAMS).unproven
    assert not unproven[2:, 120:128].any() and unproven[:2, 120:128].all()
    estimator.clear()
    assert not estimator.estimate(PARAMS).unproven.any()


def test_after_a_shift_a_k_alone_in_its_graph_kind_on_a_few_steps_is_unproven() -> None:
    # H200 decode-heavy B≈254 (docs/results.md, "At 1cd9e3d"): k=1, alone off the graph the
    # profile timed it on, had 3 burst steps since a shift, all on the graph (17 ms), and was
    # pushed over the running k=0 (ran at twice that). Here k=3 is alone in its kind at 128.
    off = np.zeros((len(KS), len(GRID)), dtype=bool)
    off[3, GRID.index(128)] = True
    estimator = StepTimeEstimator(StepTimeLayout(PROFILE, 256, off_graph=off))
    estimator.add(_steps(1, [128], 1.0, repeat=1000), now=0.0, half_life_s=1e9, shift=0.15)
    estimator.add(_steps(1, [128], 2.0, repeat=300), now=1.0, half_life_s=1e9, shift=0.15)
    unproven = estimator.estimate(PARAMS).unproven
    assert not unproven[3, 127]  # nothing of its own: the profile's, as before the shift
    burst = {**_steps(1, [128], 2.0, repeat=100), **_steps(3, [128], 0.5, repeat=5)}
    estimator.add(burst, now=2.0, half_life_s=1e9, shift=0.15)
    unproven = estimator.estimate(PARAMS).unproven
    assert unproven[3, 120:128].all() and not unproven[1, 120:128].any()
    # As many steps of its own as the prior weighs (w = 100): its own evidence leads.
    more = {**_steps(1, [128], 2.0, repeat=300), **_steps(3, [128], 0.5, repeat=95)}
    estimator.add(more, now=3.0, half_life_s=1e9, shift=0.15)
    assert not estimator.estimate(PARAMS).unproven[3, 120:128].any()


def test_borrowing_across_graph_modes_is_not_leaning_on_other_k() -> None:
    # The profile timed k=2/3 off the full graph at B 121..128: k=0/1's steps there say
    # nothing of them (they borrow nothing), so only k=0 leans on k=1's steps after a shift.
    off = np.zeros((len(KS), len(GRID)), dtype=bool)
    off[2:, GRID.index(128)] = True
    estimator = StepTimeEstimator(StepTimeLayout(PROFILE, 256, off_graph=off))
    estimator.add(_steps(1, [128], 1.0, repeat=1000), now=0.0, half_life_s=1e9, shift=0.15)
    estimator.add(_steps(1, [128], 2.0, repeat=300), now=1.0, half_life_s=1e9, shift=0.15)
    unproven = estimator.estimate(PARAMS).unproven
    assert unproven[0, 127] and not unproven[1:, 127].any()


def test_a_cell_regrowing_its_steps_after_a_shift_has_not_lost_sight_of_its_traffic() -> None:
    # After a shift the running k's faded steps climb back past the shift check's 200 and,
    # a cycle later, fade just under it: that is not the load leaving the cell. Counted as
    # such, it cleared what every k had measured and ended the shift's caution seconds after.
    estimator = _estimator()
    estimator.add(_steps(1, [128], 1.0, repeat=300), now=0.0, half_life_s=60.0)
    estimator.add(_steps(1, [128], 1.7, repeat=100), now=3.0, half_life_s=60.0, shift=0.15)
    for t in range(6, 30, 3):
        estimator.add(_steps(1, [128], 1.7, repeat=100), now=float(t), half_life_s=60.0)
    col = estimator.layout.cells.index((121, 128))
    assert estimator.measured[1, col] == pytest.approx(900)
    assert estimator.shifted[col]


def test_a_shift_shows_within_a_cycle_of_slow_steps_and_only_at_the_running_k() -> None:
    # Long prompts at B~216 on the emulator: ~180 steps a cycle, and the shift waited two
    # cycles for 200 fresh steps while the table ran the old traffic's k.
    estimator = _estimator()
    before = {**_steps(1, [128], 1.0, repeat=3000), **_steps(3, [128], 1.0, repeat=300)}
    estimator.add(before, now=0.0, half_life_s=1e9, shift=0.15)
    # A burst's k alone moved (40 steps, against the running k's 150 unchanged): no shift.
    burst = {**_steps(1, [128], 1.0, repeat=150), **_steps(3, [128], 1.6, repeat=40)}
    estimator.add(burst, now=1.0, half_life_s=1e9, shift=0.15)
    col = estimator.layout.cells.index((121, 128))
    assert estimator.estimate(PARAMS).measured[3, col] == pytest.approx(340)
    # The running k moved, over 150 steps: the cell's other k are measured afresh.
    estimator.add(_steps(1, [128], 1.6, repeat=150), now=2.0, half_life_s=1e9, shift=0.15)
    assert estimator.estimate(PARAMS).measured[3, col] == 0


def test_a_shift_is_judged_on_steps_counted_as_correlated_as_the_estimate_counts_them() -> None:
    # 30 fresh steps 20 % slower, spread 20 % a step: outside four standard errors of 30
    # independent steps, inside four of 15 (correlation 2, the daemon's default). On the H200's
    # steady traffic the first read 9 changes in 23 daemon parts, the second 5.
    def shifted(correlation: float) -> bool:
        estimator = _estimator()
        estimator.add(_steps(3, [128], 1.0, repeat=1000), now=0.0, half_life_s=1e9)
        counter = StepCellCounter()
        for i in range(30):
            factor = 1.2 * (1.2 if i % 2 else 0.8)
            counter.record(batch_size=128, k=3, duration_s=factor * PROFILE.at(128, 3) / 1e3,
                           tokens=512)  # fmt: skip
        fresh = counter.totals()
        estimator.add(fresh, now=1.0, half_life_s=1e9, shift=0.15, correlation=correlation)
        return bool(estimator.shifted.any())

    assert shifted(correlation=1.0) and not shifted(correlation=2.0)


def test_only_the_busiest_k_of_a_cell_counts_as_run_and_a_shift_or_restart_forgets_it() -> None:
    # A cycle of k=3 with k=2 bursts (40 of 540 steps): k=3 ran, k=2 only burst.
    estimator = _estimator()
    estimator.add(
        {**_steps(3, [128], 1.0, repeat=500), **_steps(2, [128], 1.2, repeat=40)},
        now=0.0,
        half_life_s=1e9,
        shift=0.15,
    )
    col = estimator.layout.cells.index((121, 128))
    estimate = estimator.estimate(PARAMS)
    assert estimate.ran[3, col] == pytest.approx(500) and estimate.ran[2, col] == 0
    assert estimate.measured[2, col] == pytest.approx(40)
    # The table moves to k=2 (a trial): now k=2 is the one that runs, k=3's runs are kept.
    estimator.add(_steps(2, [128], 1.2, repeat=300), now=1.0, half_life_s=1e9, shift=0.15)
    estimate = estimator.estimate(PARAMS)
    assert estimate.ran[2, col] == pytest.approx(300) and estimate.ran[3, col] == pytest.approx(500)
    # Longer prompts: k=2 runs 1.6x as long, what every k ran is forgotten, bar this cycle's.
    estimator.add(_steps(2, [128], 1.92, repeat=300), now=2.0, half_life_s=1e9, shift=0.15)
    estimate = estimator.estimate(PARAMS)
    assert estimate.ran[3, col] == 0 and estimate.ran[2, col] == pytest.approx(300)
    estimator.clear()
    assert not estimator.estimate(PARAMS).ran.any()


# -- a k whose steps at this traffic leave the CUDA graph the profile timed it on ----------------

LIMIT = 512  # the H200 engine's largest full graph, in tokens
OFF_AT_256 = np.zeros((len(KS), len(GRID)), dtype=bool)
OFF_AT_256[2:, GRID.index(256)] = True  # the profile timed k=2/3 eager at 256 (past 512)


def _served(k: int, batch: int, factor: float, prefill: int, repeat: int) -> dict:
    """Cells of ``repeat`` steps at ``batch`` carrying ``prefill`` prompt tokens each."""
    counter = StepCellCounter()
    for _ in range(repeat):
        counter.record(
            batch_size=batch, k=k, duration_s=factor * PROFILE.at(batch, k) / 1000.0,
            tokens=batch * (1 + k) + prefill,
        )  # fmt: skip
    return counter.totals()


def _served_estimator(limit: int | None = LIMIT) -> StepTimeEstimator:
    return StepTimeEstimator(
        StepTimeLayout(PROFILE, 256, off_graph=OFF_AT_256, capture_limit=limit)
    )


def test_a_k_that_would_leave_the_graph_borrows_nothing_from_the_k_on_it() -> None:
    # The H200 at decode-heavy B≈254: k=0 runs at 256 + 25 tokens a step, on the graph; k=1,
    # timed on the graph at 512, would hold 537 and run eager: nothing speaks for it yet.
    estimator = _served_estimator()
    estimator.add(_served(0, 256, 1.6, 25, 3000), now=0.0, half_life_s=1e9)
    estimate = estimator.estimate(PARAMS)
    t_hat = {k: estimate.step_times.at(256, k) for k in KS}
    assert t_hat[0] == pytest.approx(1.6 * PROFILE.at(256, 0), rel=0.01)
    assert t_hat[1] > 100 * PROFILE.at(256, 1)  # unknown: no table picks it
    # k=2, timed eager and eager at this traffic too, shares k=0's ratio: the traffic kept
    # both kinds, and what it adds (prompt tokens, longer contexts) rides on either.
    assert t_hat[2] == pytest.approx(1.6 * PROFILE.at(256, 2), rel=0.02)
    # Without the capture limit (older profiles) the groups are the profile's kinds, as they
    # were: k=1 borrows k=0's ratio, k=2 (eager) has nothing to borrow.
    blind = _served_estimator(limit=None)
    blind.add(_served(0, 256, 1.6, 25, 3000), now=0.0, half_life_s=1e9)
    estimate = blind.estimate(PARAMS)
    assert estimate.step_times.at(256, 1) == pytest.approx(1.6 * PROFILE.at(256, 1), rel=0.05)
    assert estimate.step_times.at(256, 2) == pytest.approx(PROFILE.at(256, 2))


def test_its_own_steps_speak_for_it_without_the_pull_toward_the_graphs_time() -> None:
    estimator = _served_estimator()
    estimator.add(_served(0, 256, 1.6, 25, 300), now=0.0, half_life_s=1e9)
    estimator.add(_served(1, 256, 2.1, 25, 5), now=1.0, half_life_s=1e9)  # a burst
    # The prior weight w still holds, but at the k's own live ratio, not the profile's 1.
    assert estimator.estimate(PARAMS).step_times.at(256, 1) == pytest.approx(
        2.1 * PROFILE.at(256, 1), rel=0.01
    )


def test_when_the_running_k_left_the_graph_too_the_others_borrow_its_ratio() -> None:
    # Chat-like prompts: k=0's steps carry 600 prompt tokens and run eager themselves, so its
    # ratio (graph to eager) is the right one to lend to k=1, which leaves the graph alike.
    estimator = _served_estimator()
    estimator.add(_served(0, 256, 3.3, 600, 300), now=0.0, half_life_s=1e9)
    estimate = estimator.estimate(PARAMS)
    assert estimate.step_times.at(256, 1) == pytest.approx(3.3 * PROFILE.at(256, 1), rel=0.01)
    assert estimate.step_times.at(256, 3) == pytest.approx(PROFILE.at(256, 3))  # eager-timed


def test_a_cell_with_few_steps_takes_the_prompt_tokens_riding_along_from_the_replicas() -> None:
    # The H200 after a change to chat-like at 192 clients: 185-192 ran k=3 with ~1,200 prompt
    # tokens a step; 177-184 had 9 steps of k=1 carrying 180. Read from those 9 alone, k=0 at
    # 177-184 would stay on its graph (180 + 180 < 512), stand apart from k=1's live ratio
    # (3.8x) on the profile's pure-decode time, look 1.6x better than any k and be put in (it
    # ran 27 % behind k=3 there). What rides along is the traffic's: the replica's steps say
    # k=0 leaves the graph there too, and shares k=1's ratio.
    def estimator_with(busy: bool) -> StepTimeEstimator:
        estimator = _served_estimator()
        if busy:
            estimator.add(_served(3, 188, 1.5, 1200, 300), now=0.0, half_life_s=1e9)
        estimator.add(_served(1, 180, 3.8, 180, 9), now=0.0, half_life_s=1e9)
        return estimator

    estimate = estimator_with(busy=True).estimate(PARAMS)
    assert estimate.step_times.at(180, 0) == pytest.approx(3.8 * PROFILE.at(180, 0), rel=0.05)
    # Alone, the cell's own steps are all there is to read the prompts from, as before.
    estimate = estimator_with(busy=False).estimate(PARAMS)
    assert estimate.step_times.at(180, 0) == pytest.approx(PROFILE.at(180, 0), rel=0.01)


def _bursts(k: int, batch: int, factors: list[float], prefill: int) -> dict:
    """Burst steps of ``k`` at ``batch``, one step a factor (x the profile)."""
    counter = StepCellCounter()
    for factor in factors:
        counter.record(
            batch_size=batch, k=k, duration_s=factor * PROFILE.at(batch, k) / 1000.0,
            tokens=batch * (1 + k) + prefill,
        )  # fmt: skip
    return counter.totals()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=30, max_value=200),  # from 30 steps a cell's spread is its own
    st.floats(min_value=1.2, max_value=3.0),
    st.floats(min_value=0.05, max_value=0.6),
)
def test_a_k_off_the_graph_known_from_its_bursts_keeps_their_standard_error(
    steps: int, factor: float, spread: float
) -> None:
    # Its estimate stands on its own steps alone (the pull is toward their mean): the prior's
    # weight must not narrow it below their standard error. On the H200 at decode-heavy
    # B≈254 the narrower band let noisy k=1 bursts (0.6 relative spread a step) push k=1.
    estimator = _served_estimator()
    estimator.add(_served(0, 256, 1.6, 25, 3000), now=0.0, half_life_s=1e9)
    factors = [factor * (1 + spread if i % 2 else 1 - spread) for i in range(steps)]
    estimator.add(_bursts(1, 256, factors, 25), now=1.0, half_life_s=1e9)
    estimate = estimator.estimate(PARAMS)
    row, col = estimate.ks.index(1), estimate.cells.index((249, 256))
    live = np.array(factors)
    own_error = live.std() * np.sqrt(PARAMS.correlation / steps) / live.mean()
    assert estimate.sigma[row, col] / estimate.ratio[row, col] >= own_error * (1 - 1e-9)
    assert estimate.ratio[row, col] == pytest.approx(live.mean() * 1.0, rel=1e-6)


def _spread(k: int, batch: int, factor: float, spread: float, prefill: int, repeat: int) -> dict:
    """Steps of ``k`` at ``batch`` alternating ``factor`` x (1 -/+ ``spread``) x the profile."""
    counter = StepCellCounter()
    for i in range(repeat):
        step_s = factor * (1 + spread if i % 2 else 1 - spread) * PROFILE.at(batch, k) / 1000.0
        counter.record(batch_size=batch, k=k, duration_s=step_s,
                       tokens=batch * (1 + k) + prefill)  # fmt: skip
    return counter.totals()


@settings(max_examples=40, deadline=None)
@given(
    st.floats(min_value=0.1, max_value=0.6),  # the running k's relative spread a step
    st.floats(min_value=1.5, max_value=4.0),  # the thin k's level over the running one's
    st.integers(min_value=2, max_value=29),  # its steps: too few for a spread of its own
)
def test_a_k_known_from_a_few_steps_takes_the_replicas_spread_at_its_own_level(
    spread: float, above: float, steps: int
) -> None:
    # A spread is borrowed as a share of the step, not in the profile's units: on the H200
    # (decode-heavy -> chat-like, 21:38) k=1 ran 3.9x its profile, the running k=3 1.8x;
    # k=1's three burst steps, taken at k=3's spread in profile units, stood at +-2.6 % and
    # pushed it for a cycle (it ran 48 ms where they read 32).
    estimator = _served_estimator()
    estimator.add(_spread(0, 256, 1.6, spread, 25, 3000), now=0.0, half_life_s=1e9)
    estimator.add(_bursts(1, 256, [1.6 * above] * steps, 25), now=1.0, half_life_s=1e9)
    estimate = estimator.estimate(PARAMS)
    row, col = estimate.ks.index(1), estimate.cells.index((249, 256))
    borrowed_error = spread * np.sqrt(PARAMS.correlation / steps)
    assert estimate.sigma[row, col] / estimate.ratio[row, col] >= borrowed_error * (1 - 1e-6)


def test_the_priors_spread_is_a_share_of_what_it_pulls_toward() -> None:
    # Under long contexts every k runs ~3x its pure-decode profile; a k with no step of its own
    # stands on that pull, and its uncertainty is the prior's share of it, not of the profile
    # (at long-context B≈186 k=0 and k=1 stood at +-0.2 %, 16-25 % off their arms).
    estimator = _estimator()
    estimator.add(_steps(3, [188], 3.0, repeat=3000), now=0.0, half_life_s=1e9)
    estimate = estimator.estimate(PARAMS)
    row = estimate.ks.index(2)
    assert estimate.ratio[row, estimate.cells.index((185, 192))] > 2.5
    assert estimate.relative_sigma[row, 188 - 1] >= PARAMS.prior_sigma * (1 - 1e-9)
