"""Counter increases -> an Observation: engines summed cell by cell, positions in order, the
running gauge only when no step decoded, unknown labels ignored."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune import metric_names as mn
from tabletune.daemon.counters import (
    ACCEPTED,
    CELL_FIELDS,
    DRAFTED,
    GENERATED,
    WITHOUT_DECODE,
    CounterKey,
    both_spellings,
    canonical_name,
    observation_from,
    step_cells_of,
)
from tabletune.daemon.observation import Observation
from tabletune.step_cells import CellTotals, StepCellCounter, cell_label, merge_cells

FIELD_OF = {field: family for family, field in CELL_FIELDS.items()}


def cell_increases(
    engine: str, cells: dict[tuple[int, int, int], CellTotals]
) -> dict[CounterKey, float]:
    out: dict[CounterKey, float] = {}
    for (k, low, high), totals in cells.items():
        for field, family in FIELD_OF.items():
            out[(family, engine, "", str(k), cell_label((low, high)))] = getattr(totals, field)
    return out


def observe(increases: dict[CounterKey, float], running: float | None = None) -> Observation:
    return observation_from(
        increases,
        replica="r",
        admin_url="http://r",
        interval_s=10.0,
        running=running,
        reset=False,
        model_name="m",
    )


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["0", "1", "2"]),
            st.integers(min_value=1, max_value=200),
            st.integers(min_value=0, max_value=3),
            st.floats(min_value=0.001, max_value=0.1),
        ),
        max_size=40,
    )
)
def test_engines_are_merged_cell_by_cell(steps: list[tuple[str, int, int, float]]) -> None:
    counters: dict[str, StepCellCounter] = {}
    for engine, batch, k, seconds in steps:
        counters.setdefault(engine, StepCellCounter()).record(
            batch_size=batch, k=k, duration_s=seconds, tokens=batch
        )
    increases: dict[CounterKey, float] = {}
    for engine, counter in counters.items():
        increases.update(cell_increases(engine, counter.totals()))
    expected = merge_cells(c.totals() for c in counters.values())
    got = step_cells_of(increases)
    assert got.keys() == expected.keys()
    for key, totals in expected.items():
        assert got[key].steps == totals.steps
        assert got[key].seconds == pytest.approx(totals.seconds)
        assert got[key].requests == totals.requests
    obs = observe(increases, running=99.0)
    if steps:
        assert obs.mean_batch == pytest.approx(sum(b for _, b, _, _ in steps) / len(steps))
    else:
        assert obs.mean_batch == 99.0


def test_positions_tokens_and_prefill_only_steps() -> None:
    increases = {
        (DRAFTED, "0", "0", "", ""): 100.0,
        (DRAFTED, "1", "0", "", ""): 50.0,
        (DRAFTED, "0", "2", "", ""): 20.0,
        (ACCEPTED, "0", "0", "", ""): 70.0,
        (GENERATED, "0", "", "", ""): 300.0,
        (GENERATED, "1", "", "", ""): 100.0,
        (WITHOUT_DECODE, "1", "", "", ""): 4.0,
    }
    obs = observe(increases, running=3.0)
    assert obs.drafted == (150.0, 0.0, 20.0)
    assert obs.accepted == (70.0, 0.0, 0.0)
    assert obs.generated_tokens == 400.0
    assert obs.tokens_per_s == 40.0
    assert obs.steps_without_decode == 4.0
    assert obs.mean_batch == 3.0 and obs.step_cells == {}
    assert obs.model_name == "m" and not obs.reset


def test_series_that_are_not_cells_are_ignored() -> None:
    steps = f"{mn.TT_STEPS}_total"
    increases = {
        (steps, "0", "", "x", "5"): 3.0,
        (steps, "0", "", "1", "17-23"): 3.0,
        (steps, "0", "", "1", "5"): 3.0,
        (f"{mn.TT_STEP_REQUESTS}_total", "0", "", "1", "5"): 15.0,
        (steps, "0", "", "2", "6"): 0.0,  # a cell without a step in the window
    }
    assert step_cells_of(increases) == {(1, 5, 5): CellTotals(steps=3.0, requests=15.0)}


def test_vllm_names_in_both_spellings() -> None:
    assert canonical_name("vllm_generation_tokens_total") == GENERATED
    assert canonical_name(DRAFTED) == DRAFTED
    assert both_spellings(GENERATED) == (GENERATED, "vllm_generation_tokens_total")
    assert both_spellings(DRAFTED) == (DRAFTED,)
