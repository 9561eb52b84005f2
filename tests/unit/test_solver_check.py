"""Solution.check is a real self-check: each broken promise is caught with its reason."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tabletune.solver import Solution, SolverError, solve
from tests.unit.references import TABLE_REFERENCES


def reference(name: str) -> Solution:
    (ref,) = [r for r in TABLE_REFERENCES if r.name == name]
    return solve(ref.problem)


MERGED = "narrow-run-joins-the-neighbour-that-keeps-more"  # ((1, 4, 1), (5, 10, 3)), width 3
KEPT = "cheap-k3-gain-inside-the-noise-keeps-the-running-k"  # k=1 kept within 1.5 sigma


@pytest.mark.parametrize(
    ("name", "changes", "message"),
    [
        (MERGED, {"ranges": ((1, 4, 1), (6, 10, 3))}, "leaves a gap"),
        (MERGED, {"ranges": ((1, 4, 1), (5, 9, 3))}, "ranges end at 9, not at 10"),
        (MERGED, {"allowed_k": frozenset({1, 2})}, "disallowed k"),
        (MERGED, {"ranges": ((1, 5, 1), (6, 10, 3))}, "do not reproduce the per-batch choice"),
        (MERGED, {"min_width": 5}, r"\(1, 4, 1\) is narrower than min_width=5"),
        (MERGED, {"min_width": 2}, "replaces the rule's k=2 though its run is not narrower"),
        (KEPT, {"confidence": 1.0}, "more than 0.5% and 1 sigma"),
        (KEPT, {"goodput_sigma": (0.0,), "best_goodput_sigma": (0.0,)}, "below the best"),
        (MERGED, {"summaries": ()}, "summaries do not match"),
    ],
)
def test_a_tampered_solution_fails_its_check(
    name: str, changes: dict[str, Any], message: str
) -> None:
    solution = reference(name)
    solution.check()
    with pytest.raises(SolverError, match=message):
        replace(solution, **changes).check()
