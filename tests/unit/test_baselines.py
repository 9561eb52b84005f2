"""Each baseline policy's defining behaviour."""

from __future__ import annotations

import numpy as np
import pytest

from tabletune.baselines import (
    FixedKPolicy,
    LinearStepModel,
    NightjarStylePolicy,
    StepOutcome,
    TablePolicy,
    TurboSpecStylePolicy,
    UcbBandit,
    expected_tokens_iid,
)
from tabletune.solver import SolverError, StepTimes

GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256)
KS = (0, 1, 2, 3)
TRUE = LinearStepModel(intercept=4.0, per_token=0.02, per_draft_step=0.3, per_draft_row=0.004)


def linear_profile(model: LinearStepModel) -> StepTimes:
    ms = np.array([[model.predict(b, k) for b in GRID] for k in KS])
    return StepTimes(grid=GRID, ks=KS, ms=ms)


def test_linear_fit_recovers_intercept_and_slopes_of_a_linear_profile() -> None:
    fitted = LinearStepModel.fit(linear_profile(TRUE))
    assert fitted.intercept == pytest.approx(4.0, abs=1e-9)
    assert fitted.per_token == pytest.approx(0.02, abs=1e-12)
    assert fitted.per_draft_step == pytest.approx(0.3, abs=1e-9)
    assert fitted.per_draft_row == pytest.approx(0.004, abs=1e-12)
    assert fitted.predict(100, 2) == pytest.approx(4.0 + 0.02 * 300 + 2 * (0.3 + 0.4))


def test_linear_fit_smooths_a_real_jump_away() -> None:
    step_times = linear_profile(TRUE)
    ms = step_times.ms.copy()
    jump = 3 * ms[KS.index(2), GRID.index(4)]
    ms[KS.index(2), GRID.index(4)] = jump
    fitted = LinearStepModel.fit(StepTimes(grid=GRID, ks=KS, ms=ms))
    assert fitted.predict(4, 2) < 0.5 * jump  # the measured cell is 3x its neighbours


def test_linear_fit_needs_more_than_one_draft_length() -> None:
    one_k = StepTimes(grid=GRID, ks=(3,), ms=np.ones((1, len(GRID))))
    with pytest.raises(SolverError, match="two draft lengths"):
        LinearStepModel.fit(one_k)


def test_expected_tokens_under_independent_acceptance() -> None:
    assert expected_tokens_iid(0.5, 0) == 1.0
    assert expected_tokens_iid(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens_iid(1.0, 3) == 4.0
    with pytest.raises(SolverError):
        expected_tokens_iid(1.5, 1)


def outcome(batch: int, k: int, accepted: tuple[int, ...], step_ms: float = 10.0) -> StepOutcome:
    drafted = tuple(batch if i < k else 0 for i in range(3))
    return StepOutcome(batch_size=batch, k=k, step_ms=step_ms, drafted=drafted, accepted=accepted)


def test_turbospec_tracks_the_token_acceptance_rate_online() -> None:
    policy = TurboSpecStylePolicy(TRUE, KS, prior_alpha=0.9, decay=0.99)
    assert policy.alpha == pytest.approx(0.9)
    # alpha = 0.6 exactly: 100 requests reach guess 1, 60 reach guess 2, 36 reach guess 3.
    for _ in range(2000):
        policy.observe(outcome(100, 3, (60, 36, 22)))
    assert policy.alpha == pytest.approx(118 / 196, abs=1e-6)


def test_turbospec_ignores_steps_without_drafts() -> None:
    policy = TurboSpecStylePolicy(TRUE, KS, prior_alpha=0.7)
    policy.observe(outcome(64, 0, (0, 0, 0)))
    assert policy.alpha == pytest.approx(0.7)


def test_turbospec_picks_argmax_of_linear_goodput() -> None:
    # Drafting costs almost nothing: longest k at small batch; tokens dominate at B=256 -> 0.
    model = LinearStepModel(intercept=5.0, per_token=0.05, per_draft_step=0.0, per_draft_row=0.0)
    policy = TurboSpecStylePolicy(model, KS, prior_alpha=0.6)
    assert policy.choose_k(1, 0) == 3
    assert policy.choose_k(256, 0) == 0
    expected = max(KS, key=lambda k: 256 * expected_tokens_iid(0.6, k) / model.predict(256, k))
    assert policy.choose_k(256, 0) == expected


def test_ucb_bandit_converges_to_the_best_arm_on_a_stationary_reward() -> None:
    rng = np.random.default_rng(7)
    means = {0: 0.5, 1: 0.6, 2: 0.8, 3: 0.7}
    bandit = UcbBandit(means, exploration=1.0)
    for _ in range(20000):
        arm = bandit.select()
        bandit.update(arm, float(rng.random() < means[arm]))
    assert bandit.best_arm() == 2
    assert bandit.pulls[2] > 0.8 * bandit.rounds
    assert all(bandit.pulls[arm] > 0 for arm in means)  # every arm was explored


def test_ucb_bandit_plays_every_arm_once_first() -> None:
    bandit = UcbBandit((0, 1, 3))
    played = []
    for _ in range(3):
        arm = bandit.select()
        played.append(arm)
        bandit.update(arm, 0.0)
    assert sorted(played) == [0, 1, 3]


def test_nightjar_keeps_one_bandit_per_batch_size() -> None:
    # Deterministic goodput: k=3 best at B=1, k=0 best at B=200.
    def step_ms(batch: int, k: int) -> float:
        return 4.0 + batch * 0.05 * (1 + 2 * k)

    policy = NightjarStylePolicy(KS, exploration=0.5)
    for step in range(4000):
        for batch in (1, 200):
            k = policy.choose_k(batch, step)
            drafted = tuple(batch if i < k else 0 for i in range(3))
            policy.observe(StepOutcome(batch, k, step_ms(batch, k), drafted, drafted))  # all kept
    assert policy.bandit(1).best_arm() == 3
    assert policy.bandit(200).best_arm() == 0
    assert set(policy.bandits) == {1, 200}


def test_table_policy_looks_up_like_vllm() -> None:
    policy = TablePolicy(((1, 64, 3), (65, 128, 1), (129, 512, 0)), max_batch=256, name="docs")
    assert [policy.choose_k(b, 0) for b in (1, 64, 65, 128, 129, 256)] == [3, 3, 1, 1, 0, 0]
    quarter = TablePolicy(((1, 16, 3), (17, 32, 1), (33, 128, 0)), max_batch=256, name="q")
    assert quarter.choose_k(200, 0) == 0  # the tail carries the last k forward
    assert FixedKPolicy(2).choose_k(200, 5) == 2
    assert FixedKPolicy(0).name == "no speculation"
