"""Per-step draft-length decisions (exploration, hysteresis): pure, no vLLM."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.plugin.policy import StepPolicy, hysteresis_masks, neighbour_table
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


# Neighbour exploration: k=3 up to B=8, k=1 from 9; allowed 0, 1, 3.
ALLOWED = (0, 1, 3)


def test_neighbour_table_holds_the_adjacent_allowed_lengths_lower_first() -> None:
    assert neighbour_table(ALLOWED, (0, 1, 2, 3)) == {0: (1,), 1: (0, 3), 2: (1, 3), 3: (1,)}
    assert neighbour_table((3,), (3,)) == {3: ()}


def test_neighbour_steps_alternate_lower_and_higher() -> None:
    policy = StepPolicy(LOOKUP, explore_k=3, neighbour_interval=3, allowed_k=ALLOWED)
    ks = [policy[12] for _ in range(12)]  # table k=1: neighbours 0 and 3
    assert ks == [1, 1, 0, 1, 1, 3, 1, 1, 0, 1, 1, 3]
    assert policy.neighbour_steps == 4 and policy.exploration_steps == 0


def test_where_only_one_neighbour_exists_it_is_used() -> None:
    policy = StepPolicy(LOOKUP, explore_k=3, neighbour_interval=2, allowed_k=ALLOWED)
    assert [policy[4] for _ in range(6)] == [3, 1, 3, 1, 3, 1]  # k=3 is the longest allowed


def test_no_neighbour_no_neighbour_step() -> None:
    policy = StepPolicy([0, 3, 3], explore_k=3, neighbour_interval=1, allowed_k=(3,))
    assert [policy[2] for _ in range(3)] == [3, 3, 3] and policy.neighbour_steps == 0


def test_exploration_steps_take_precedence_over_neighbour_steps() -> None:
    policy = StepPolicy(
        LOOKUP, explore_k=3, exploration_interval=4, neighbour_interval=2, allowed_k=ALLOWED
    )
    assert [policy[12] for _ in range(8)] == [1, 0, 1, 3, 1, 3, 1, 3]
    assert policy.exploration_steps == 2 and policy.neighbour_steps == 2


def test_neighbour_step_does_not_become_the_held_k() -> None:
    policy = StepPolicy(LOOKUP, explore_k=3, hysteresis=1, neighbour_interval=2, allowed_k=ALLOWED)
    assert policy[12] == 1
    assert policy[12] == 0  # neighbour
    assert policy.previous_k == 1 and policy[12] == 1


def test_neighbour_exploration_needs_the_allowed_k() -> None:
    with pytest.raises(ValueError, match="allowed"):
        StepPolicy(LOOKUP, explore_k=3, neighbour_interval=5)
    with pytest.raises(ValueError):
        StepPolicy(LOOKUP, explore_k=3, neighbour_interval=-1, allowed_k=ALLOWED)


policy_inputs = st.fixed_dictionaries(
    {
        "allowed": st.sets(st.integers(min_value=0, max_value=5), min_size=1, max_size=4),
        "length": st.integers(min_value=1, max_value=24),
        "seed": st.integers(min_value=0, max_value=10_000),
        "n1": st.integers(min_value=0, max_value=7),
        "n2": st.integers(min_value=1, max_value=7),
        "h": st.integers(min_value=0, max_value=3),
        "batches": st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=60),
    }
)


def _policy(d: dict) -> tuple[StepPolicy, list[int]]:
    allowed = sorted(d["allowed"])
    lookup = [0] + [allowed[(d["seed"] * (b + 7)) % len(allowed)] for b in range(d["length"])]
    policy = StepPolicy(
        lookup,
        explore_k=max(allowed),
        exploration_interval=d["n1"],
        hysteresis=d["h"],
        neighbour_interval=d["n2"],
        allowed_k=allowed,
    )
    return policy, allowed


@given(policy_inputs)
def test_neighbour_k_is_always_an_allowed_k_adjacent_to_the_k_after_hysteresis(d: dict) -> None:
    policy, allowed = _policy(d)
    for b in d["batches"]:
        neighbours_before = policy.neighbour_steps
        k = policy[b]
        held = policy.previous_k  # the table's k after hysteresis, for this step
        assert held is not None
        if policy.neighbour_steps > neighbours_before:
            assert k in allowed
            between = [a for a in allowed if min(k, held) < a < max(k, held)]
            assert k != held and not between


@given(policy_inputs)
def test_exact_share_of_neighbour_steps(d: dict) -> None:
    policy, allowed = _policy(d)
    expected = 0
    for step, b in enumerate(d["batches"], start=1):
        policy[b]
        held = policy.previous_k
        explored = d["n1"] and step % d["n1"] == 0 and held != max(allowed)
        if step % d["n2"] == 0 and not explored and len(allowed) > 1:
            expected += 1
    assert policy.neighbour_steps == expected


@given(policy_inputs)
def test_hysteresis_is_untouched_by_neighbour_steps(d: dict) -> None:
    with_neighbours, _ = _policy(d)
    without, _ = _policy({**d, "n2": 0})
    for b in d["batches"]:
        with_neighbours[b]
        without[b]
        assert with_neighbours.previous_k == without.previous_k


def test_neighbour_bursts_run_consecutive_steps_then_alternate() -> None:
    policy = StepPolicy(
        LOOKUP, explore_k=3, neighbour_interval=6, neighbour_burst=3, allowed_k=ALLOWED
    )
    ks = [policy[12] for _ in range(12)]  # table k=1: neighbours 0 and 3
    assert ks == [1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 3]
    assert policy.neighbour_steps == 4


def test_a_burst_is_not_cut_by_an_exploration_step() -> None:
    policy = StepPolicy(
        LOOKUP,
        explore_k=3,
        exploration_interval=4,
        neighbour_interval=3,
        neighbour_burst=3,
        allowed_k=ALLOWED,
    )
    ks = [policy[12] for _ in range(6)]
    assert ks == [1, 1, 0, 0, 0, 3]  # step 4 (exploration) falls inside the burst: skipped
    assert policy.exploration_steps == 0


def test_a_burst_of_zero_steps_is_refused() -> None:
    with pytest.raises(ValueError, match="neighbour_burst"):
        StepPolicy(LOOKUP, explore_k=3, neighbour_interval=3, neighbour_burst=0, allowed_k=ALLOWED)


def test_chosen_neighbours_replace_the_adjacent_ones_nearest_first() -> None:
    policy = StepPolicy(
        LOOKUP,
        explore_k=3,
        neighbour_interval=2,
        neighbour_burst=1,
        neighbour_ks=(0, 3),
        allowed_k=ALLOWED,
    )
    ks = [policy[12] for _ in range(8)]  # table k=1: nearest first, 0 (one away) then 3
    assert ks == [1, 0, 1, 3, 1, 0, 1, 3]
    far = StepPolicy(
        LOOKUP, explore_k=3, neighbour_interval=2, neighbour_ks=(3,), allowed_k=(0, 1, 2, 3)
    )
    assert [far[12] for _ in range(4)] == [1, 3, 1, 3]  # 2 lies between 1 and 3: 3 by choice
    assert [far[3] for _ in range(4)] == [3, 3, 3, 3]  # where the table runs 3: nothing to explore
