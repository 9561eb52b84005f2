"""The 0.26.0 start-up fix against a stand-in with the same arithmetic as vLLM's
``CudaGraphManager._init_candidates`` (round_up by k + decode_query_len - K)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tabletune.plugin.compat import (
    is_affected_version,
    skips_table_expansion,
    wrap_init_candidates,
)

TABLE = [(1, 1, 0), (2, 2, 1), (3, 3, 2), (4, 256, 3)]


class FakeManager:
    """Reproduces the crash: for the drafter (query length 1) k + 1 - 3 <= 0."""

    def __init__(self, decode_query_len: int, table: list[tuple[int, int, int]] | None) -> None:
        spec = SimpleNamespace(num_speculative_tokens_per_batch_size=table)
        self.vllm_config = SimpleNamespace(speculative_config=spec, num_speculative_tokens=3)
        self.decode_query_len = decode_query_len
        self.sizes: list[int] = []

    def _init_candidates(self) -> None:
        spec = self.vllm_config.speculative_config
        if spec.num_speculative_tokens_per_batch_size is not None:
            extra = self.decode_query_len - self.vllm_config.num_speculative_tokens
            lens = [k + extra for _, _, k in spec.num_speculative_tokens_per_batch_size]
        else:
            lens = [self.decode_query_len]
        self.sizes = [-(-8 // q) * q for q in lens]  # round_up(8, q): q == 0 divides by zero


def test_the_stand_in_crashes_like_vllm_026() -> None:
    with pytest.raises(ZeroDivisionError):
        FakeManager(1, TABLE)._init_candidates()


def test_fixed_drafter_manager_uses_its_own_query_length_and_keeps_the_table() -> None:
    manager = FakeManager(1, TABLE)
    wrap_init_candidates(FakeManager._init_candidates)(manager)
    assert manager.sizes == [8]
    assert manager.vllm_config.speculative_config.num_speculative_tokens_per_batch_size == TABLE


def test_target_manager_still_expands_by_the_table() -> None:
    manager = FakeManager(4, TABLE)
    wrap_init_candidates(FakeManager._init_candidates)(manager)
    assert manager.sizes == [8, 8, 9, 8]  # query lengths 1, 2, 3, 4


def test_table_restored_even_when_the_original_raises() -> None:
    def broken(self: Any) -> None:
        raise RuntimeError("boom")

    manager = FakeManager(1, TABLE)
    with pytest.raises(RuntimeError):
        wrap_init_candidates(broken)(manager)
    assert manager.vllm_config.speculative_config.num_speculative_tokens_per_batch_size == TABLE


def test_no_table_no_change() -> None:
    assert not skips_table_expansion(FakeManager(1, None))
    manager = FakeManager(1, None)
    wrap_init_candidates(FakeManager._init_candidates)(manager)
    assert manager.sizes == [8]


def test_wrapping_twice_is_a_no_op() -> None:
    once = wrap_init_candidates(FakeManager._init_candidates)
    assert wrap_init_candidates(once) is once


@pytest.mark.parametrize(
    ("version", "affected"),
    [("0.26.0", True), ("0.26.1", True), ("0.25.2", False), ("0.27.0", False), ("1.26.0", False)],
)
def test_version_gate(version: str, affected: bool) -> None:
    assert is_affected_version(version) is affected
