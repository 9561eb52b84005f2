"""Ranges <-> per-batch k: one conversion, two indexings (the solver's and vLLM's)."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.solver import SolverError
from tabletune.solver.ranges import Range, compress, dense_lookup, expand, ranges_from_lookup


@st.composite
def sparse_tables(draw: st.DrawFn) -> tuple[tuple[Range, ...], int]:
    """Sorted, non-overlapping ranges from 1, with gaps (vLLM accepts them), and a max_batch."""
    count = draw(st.integers(1, 8))
    ranges: list[Range] = []
    start = 1
    for _ in range(count):
        end = start + draw(st.integers(0, 20))
        ranges.append((start, end, draw(st.integers(0, 5))))
        start = end + 1 + draw(st.integers(0, 6))
    return tuple(ranges), draw(st.integers(1, start + 10))


def k_at(ranges: tuple[Range, ...], b: int) -> int:
    """vLLM's meaning, stated plainly: the k of the last range starting at or before b."""
    return [k for start, _, k in ranges if start <= b][-1]


@given(sparse_tables())
def test_expand_gives_vllms_k_at_every_batch_size(case: tuple[tuple[Range, ...], int]) -> None:
    ranges, max_batch = case
    assert expand(ranges, max_batch) == tuple(k_at(ranges, b) for b in range(1, max_batch + 1))


@given(sparse_tables(), st.integers(1, 5))
def test_dense_lookup_is_indexed_by_batch_size_and_capped_at_k(
    case: tuple[tuple[Range, ...], int], max_k: int
) -> None:
    ranges, max_batch = case
    lookup = dense_lookup(ranges, max_batch, max_k)
    assert len(lookup) == max_batch + 1 and lookup[0] == 0
    assert lookup[1:] == [min(k_at(ranges, b), max_k) for b in range(1, max_batch + 1)]


@given(st.lists(st.integers(0, 4), min_size=1, max_size=60))
def test_compress_is_the_fewest_ranges_and_round_trips(per_batch: list[int]) -> None:
    ranges = compress(per_batch)
    assert expand(ranges, len(per_batch)) == tuple(per_batch)
    assert all(a[2] != b[2] for a, b in pairwise(ranges))
    assert ranges_from_lookup([0, *per_batch]) == ranges


def test_vllm_example_carries_gaps_and_the_tail_forward() -> None:
    # vLLM's own comment: [(1, 16, 3), (32, 128, 2)] maps 17..31 to K=3.
    lookup = dense_lookup([(1, 16, 3), (32, 128, 2)], max_batch=200, max_k=3)
    assert lookup[17:32] == [3] * 15 and lookup[129:] == [2] * 72
    assert dense_lookup([(1, 2, 3), (5, 6, 1)], max_batch=8, max_k=2) == [0, 2, 2, 2, 2, 1, 1, 1, 1]


@pytest.mark.parametrize(
    ("ranges", "max_batch", "message"),
    [
        ((), 4, "start at batch size 1"),
        (((2, 4, 1),), 4, "start at batch size 1"),
        (((1, 4, 1), (3, 6, 2)), 8, "overlaps"),
        (((1, 4, 1), (6, 5, 2)), 8, "backwards"),
        (((1, 4, 1),), 0, "max_batch"),
    ],
)
def test_malformed_ranges_are_refused(
    ranges: tuple[Range, ...], max_batch: int, message: str
) -> None:
    with pytest.raises(SolverError, match=message):
        expand(ranges, max_batch)


def test_dense_lookup_needs_a_positive_k_cap() -> None:
    with pytest.raises(SolverError, match="max_k"):
        dense_lookup([(1, 4, 1)], 4, 0)
