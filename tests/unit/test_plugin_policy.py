"""Per-step draft-length decisions (exploration, hysteresis): pure, no vLLM."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.plugin.policy import StepPolicy, hysteresis_masks
from tabletune.schemas.table import dense_lookup

# k=3 up to B=8, k=1 from 9: one edge between 8 and 9.
LOOKUP = dense_lookup(((1, 8, 3), (9, 16, 1)), 16, 3)


def test_off_policy_reads_the_table() -> None:
    policy = StepPolicy(LOOKUP, explore_k=3)
    assert [policy[b] for b in range(1, 17)] == LOOKUP[1:]
    assert policy.steps == 16 and policy.exploration_steps == 0


def test_batch_sizes_outside_the_lookup_are_clamped_like_vllm() -> None:
    policy = StepPolicy(LOOKUP, explore_k=3)
    assert policy[0] == 3 and policy[500] == 1


def test_exploration_runs_every_nth_step_at_the_longest_k() -> None:
    policy = StepPolicy(LOOKUP, explore_k=3, exploration_interval=5)
    ks = [policy[12] for _ in range(20)]
    assert ks == [1, 1, 1, 1, 3] * 4
    assert policy.exploration_steps == 4


def test_exploration_is_not_counted_where_the_table_already_uses_the_longest_k() -> None:
    policy = StepPolicy(LOOKUP, explore_k=3, exploration_interval=2)
    assert [policy[4] for _ in range(4)] == [3, 3, 3, 3]
    assert policy.exploration_steps == 0


def test_hysteresis_keeps_k_near_the_edge_and_switches_beyond_it() -> None:
    policy = StepPolicy(LOOKUP, explore_k=3, hysteresis=2)
    assert policy[8] == 3
    assert policy[9] == 3 and policy[10] == 3  # within 2 of B=8, where the table says 3
    assert policy[11] == 1  # 3 batch sizes past the edge: the table wins
    assert policy[10] == 1 and policy[7] == 1  # and now 1 holds on the way back
    assert policy[6] == 3


def test_hysteresis_off_switches_at_the_edge() -> None:
    policy = StepPolicy(LOOKUP, explore_k=3, hysteresis=0)
    assert [policy[8], policy[9], policy[8]] == [3, 1, 3]


def test_exploration_step_does_not_become_the_held_k() -> None:
    policy = StepPolicy(LOOKUP, explore_k=3, exploration_interval=2, hysteresis=1)
    assert policy[12] == 1
    assert policy[12] == 3  # exploration
    assert policy[12] == 1 and policy.previous_k == 1


def test_invalid_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        StepPolicy([0], explore_k=3)
    with pytest.raises(ValueError):
        StepPolicy(LOOKUP, explore_k=3, exploration_interval=-1)


@given(
    ks=st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=40),
    h=st.integers(min_value=0, max_value=10),
)
def test_masks_match_the_window_definition(ks: list[int], h: int) -> None:
    lookup = [0, *ks]
    masks = hysteresis_masks(lookup, h)
    for b in range(1, len(lookup)):
        window = lookup[max(1, b - h) : b + h + 1]
        assert masks[b] == sum(1 << k for k in set(window))


@given(
    ks=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=30),
    h=st.integers(min_value=0, max_value=5),
    batches=st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=50),
)
def test_hysteresis_never_strays_more_than_h_from_where_the_table_says_k(
    ks: list[int], h: int, batches: list[int]
) -> None:
    lookup = [0, *ks]
    policy = StepPolicy(lookup, explore_k=3, hysteresis=h)
    for b in batches:
        k = policy[b]
        clamped = min(b, len(lookup) - 1)
        window = lookup[max(1, clamped - h) : clamped + h + 1]
        assert k in window
