"""The in-engine Nightjar-style lookup: a bandit per batch size over the captured k."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune.plugin.bandit import NightjarLookup
from tabletune.solver import SolverError

ALLOWED = st.sets(st.integers(0, 8), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(
    allowed=ALLOWED,
    max_num_seqs=st.integers(1, 512),
    steps=st.lists(
        st.tuples(
            st.integers(-5, 600),  # batch size read
            st.integers(0, 10),  # k the step verified (may be outside the arms)
            st.integers(-3, 5000),  # kept tokens
            st.floats(-1.0, 1.0, allow_nan=False),  # seconds
        ),
        max_size=60,
    ),
    exploration=st.floats(0.0, 5.0),
)
def test_the_chosen_k_is_always_a_captured_one(
    allowed: set[int],
    max_num_seqs: int,
    steps: list[tuple[int, int, int, float]],
    exploration: float,
) -> None:
    lookup = NightjarLookup(allowed, max_num_seqs=max_num_seqs, exploration=exploration)
    for batch, k, kept, seconds in steps:
        assert lookup[batch] in allowed
        lookup.learn(batch, k, kept, seconds)
        assert lookup.table_k(batch) in allowed
    assert lookup.steps == len(steps)
    taught = sum(1 for b, k, _, s in steps if k in allowed and s > 0 and b >= 1)
    assert lookup.rewarded_steps == taught


@settings(max_examples=25, deadline=None)
@given(
    allowed=st.sets(st.integers(0, 5), min_size=2, max_size=5),
    best_index=st.integers(0, 4),
    batch=st.integers(1, 256),
)
def test_with_one_k_clearly_best_the_bandit_settles_on_it(
    allowed: set[int], best_index: int, batch: int
) -> None:
    arms = sorted(allowed)
    best = arms[best_index % len(arms)]
    lookup = NightjarLookup(arms, max_num_seqs=256, exploration=0.5)
    played = []
    for _ in range(1500):
        k = lookup[batch]
        played.append(k)
        kept = batch * (3 if k == best else 2)  # same step time: the best keeps 1.5x
        lookup.learn(batch, k, kept, 0.02)
    assert lookup.table_k(batch) == best
    assert played[-500:].count(best) > 400  # it exploits, exploring a little


def test_each_batch_size_learns_on_its_own() -> None:
    lookup = NightjarLookup([0, 3], max_num_seqs=256, exploration=0.5)
    for _ in range(600):
        for batch, best in ((1, 3), (200, 0)):
            k = lookup[batch]
            lookup.learn(batch, k, 2 * batch if k == best else batch, 0.01)
    assert (lookup.table_k(1), lookup.table_k(200)) == (3, 0)


def test_batch_sizes_beyond_the_engine_are_clamped_and_display_makes_nothing() -> None:
    lookup = NightjarLookup([1, 2], max_num_seqs=8)
    assert len(lookup) == 9
    assert lookup.table_k(50) == 1  # nothing learnt: the first arm
    lookup[50]
    lookup.learn(50, 2, 10, 0.01)
    assert lookup.table_k(8) == 2  # 50 was learnt as 8


def test_a_step_that_kept_nothing_rewards_zero_without_failing() -> None:
    lookup = NightjarLookup([0, 1], max_num_seqs=4, exploration=0.0)
    lookup.learn(2, 0, 0, 0.01)
    lookup.learn(2, 1, 0, 0.01)
    assert lookup.rewarded_steps == 2 and lookup[2] in (0, 1)


def test_no_arms_or_negative_exploration_is_refused() -> None:
    with pytest.raises(SolverError):
        NightjarLookup([], max_num_seqs=4)
    with pytest.raises(SolverError):
        NightjarLookup([1], max_num_seqs=4, exploration=-1.0)
    with pytest.raises(ValueError, match="max_num_seqs"):
        NightjarLookup([1], max_num_seqs=0)
