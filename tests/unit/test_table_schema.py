"""Table validation mirrors vLLM 0.26's validate_and_normalize_dynamic_sd_schedule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.schemas.table import (
    DOCUMENTED_EAGLE_TABLE,
    Table,
    TableError,
    dense_lookup,
    ranges_from_lookup,
)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "empty"),
        ("[[1,2,3]]", "list"),
        ([[1, 2]], "3-item"),
        ([[0, 4, 1]], "positive"),
        ([[1, -4, 1]], "positive"),
        ([[5, 4, 1]], "after its end"),
        ([[1, 4, -1]], ">= 0"),
        ([[1, 8, 1], [8, 16, 2]], "overlap"),
        ([[2, 8, 1]], "start at 1"),
        ([[1, 8, "3"]], "integer"),
        ([[1, 8, True]], "integer"),
        ([[1, 8.5, 3]], "integer"),
    ],
)
def test_invalid_tables_are_refused_with_a_reason(raw: object, message: str) -> None:
    with pytest.raises(TableError, match=message):
        Table.parse(raw)


def test_k_above_big_k_is_refused_only_when_k_is_known() -> None:
    Table.parse([[1, 4, 5]])
    with pytest.raises(TableError, match="exceeds"):
        Table.parse([[1, 4, 5]], max_k=3)


def test_unsorted_input_is_sorted_and_gaps_are_allowed_as_in_vllm() -> None:
    table = Table.parse([[17, 32, 1], [1, 8, 3]])
    assert table.ranges == ((1, 8, 3), (17, 32, 1))
    assert table.k_at(12) == 3  # gap carries the previous k forward
    assert table.k_at(1000) == 1  # so does the tail


def test_dense_lookup_matches_vllm_semantics() -> None:
    lookup = dense_lookup([(1, 2, 3), (5, 6, 1)], max_batch=8, max_k=2)
    assert lookup == [0, 2, 2, 2, 2, 1, 1, 1, 1]


@given(st.lists(st.integers(0, 4), min_size=1, max_size=60))
def test_lookup_and_ranges_round_trip(per_batch: list[int]) -> None:
    lookup = [0, *per_batch]
    ranges = ranges_from_lookup(lookup)
    assert dense_lookup(ranges, len(per_batch), 4) == lookup
    assert Table.parse([list(r) for r in ranges]).ranges == ranges


def test_parse_text_forms() -> None:
    assert Table.parse_text("docs").ranges == DOCUMENTED_EAGLE_TABLE
    assert Table.parse_text('{"ranges": [[1, 9, 2]]}').to_vllm() == [[1, 9, 2]]
    assert Table.parse_text('{"num_speculative_tokens_per_batch_size": [[1,2,1]]}').max_k == 1
    with pytest.raises(TableError, match="JSON"):
        Table.parse_text("[[1,2,")
