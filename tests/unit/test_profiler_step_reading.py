"""Step cells read from /metrics, and whether a window of them is exactly "B requests decoding
at k" (pure decode, or with a prefill stream riding along)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tabletune.profiler.errors import MeasurementError
from tabletune.profiler.step_reading import (
    CELL_SAMPLES,
    StepReading,
    parse_step_reading,
    window_broken,
    window_problem,
    window_totals,
)
from tabletune.step_cells import CellKey, CellTotals, cell_key, parse_cell_label
from tests.unit.profiler_stepper import metrics_text

VLLM_NOISE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
"""


def exported(engines: list[tuple[Mapping[CellKey, CellTotals], float, float]]) -> str:
    """/metrics as the plugin exports it, vLLM's own lines around, engines summed."""
    texts = [metrics_text(StepReading(c, w, s)) for c, w, s in engines]
    return VLLM_NOISE + "".join(
        t.replace('engine="0"', f'engine="{i}"') for i, t in enumerate(texts)
    )


totals = st.builds(
    CellTotals,
    *[st.integers(0, 10**6).map(float) for _ in range(5)],
)
cells = st.dictionaries(
    st.builds(lambda k, b: cell_key(k, b), st.integers(0, 5), st.integers(1, 600)), totals
)


@given(cells=cells, without=st.integers(0, 10**6), switches=st.integers(0, 10**6))
def test_the_plugins_export_reads_back_exactly(
    cells: dict[CellKey, CellTotals], without: int, switches: int
) -> None:
    reading = parse_step_reading(exported([(cells, float(without), float(switches))]))
    assert reading == StepReading(cells, float(without), float(switches))
    assert reading.engine_steps == sum(t.steps for t in cells.values()) + without + switches


def test_engines_are_summed_and_nothing_exported_reads_as_zero() -> None:
    one = {cell_key(1, 3): CellTotals(2, 0.02, 0.0002, 12, 6)}
    reading = parse_step_reading(exported([(one, 1, 2), (one, 3, 4)]))
    assert reading.cell(1, 3) == CellTotals(4, 0.04, 0.0004, 24, 12)
    assert (reading.steps_without_decode, reading.switch_steps) == (4, 6)
    assert parse_step_reading(VLLM_NOISE) == StepReading()


def reference_reading(text: str) -> StepReading:
    """The same reading through prometheus_client's own parser (the profiler polls /metrics
    several times a second; its own parser is the fast one, and must read what this reads)."""
    sums: dict[CellKey, list[float]] = {}
    without = switches = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in CELL_SAMPLES:
                key = (int(sample.labels["k"]), *parse_cell_label(sample.labels["batch"]))
                sums.setdefault(key, [0.0] * 5)[CELL_SAMPLES.index(sample.name)] += sample.value
            elif sample.name == "tabletune_steps_without_decode_total":
                without += sample.value
            elif sample.name == "tabletune_k_switch_steps_total":
                switches += sample.value
    return StepReading({key: CellTotals(*row) for key, row in sums.items()}, without, switches)


model_names = st.text(st.characters(codec="utf-8", exclude_characters="\x00\r"), max_size=8)


@given(cells=cells, without=st.integers(0, 10**6), model=model_names, engines=st.integers(1, 3))
def test_the_fast_parse_reads_what_prometheus_client_reads(
    cells: dict[CellKey, CellTotals], without: int, model: str, engines: int
) -> None:
    escaped = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    text = VLLM_NOISE + metrics_text(StepReading(cells, float(without), 3.0), engines=engines)
    text = text.replace('model_name="m"', f'model_name="{escaped}"')
    assert parse_step_reading(text) == reference_reading(text)


@pytest.mark.parametrize(
    "line",
    [
        'tabletune_steps_total{ k = "1" , batch="3",engine="0",} 2.0',  # spaces, trailing comma
        'tabletune_steps_total{batch="3",k="1"} 2.0 1700000000000',  # a timestamp
        'tabletune_steps_total{k="1",batch="3",model_name="a \\"b\\" c}"} 2e0',  # escapes
        'tabletune_steps_total{k="1",batch="3"} +Inf',
    ],
)
def test_valid_exposition_oddities_read_as_prometheus_client_reads_them(line: str) -> None:
    text = VLLM_NOISE + "# TYPE tabletune_steps counter\n" + line + "\n"
    assert parse_step_reading(text) == reference_reading(text)


@pytest.mark.parametrize(
    "line",
    [
        'tabletune_steps_total{k="1",batch="3"} two',
        'tabletune_steps_total{k="1",batch="3" 2.0',
        'tabletune_steps_total{k="1",batch=3} 2.0',
        'tabletune_steps_total{batch="3"} 2.0',
    ],
)
def test_a_malformed_plugin_line_is_a_measurement_error(line: str) -> None:
    with pytest.raises(MeasurementError, match="/metrics"):
        parse_step_reading(line + "\n")


def test_a_malformed_step_cell_is_a_measurement_error() -> None:
    text = 'tabletune_steps_total{k="1",batch="3-9",engine="0",model_name="m"} 2.0\n'
    with pytest.raises(MeasurementError, match="not a step cell"):
        parse_step_reading(text)


def test_counters_going_back_mean_a_restart() -> None:
    later = StepReading({cell_key(0, 1): CellTotals(1, 0.1, 0.01, 1, 1)})
    earlier = StepReading({cell_key(0, 1): CellTotals(5, 0.5, 0.05, 5, 5)})
    with pytest.raises(MeasurementError, match="restart"):
        later.since(earlier)
    with pytest.raises(MeasurementError, match="restart"):
        StepReading().since(earlier)


def steps(k: int, batch: int, n: int, *, ms: float = 5.0, extra_tokens: int = 0) -> CellTotals:
    s = ms / 1000
    return CellTotals(n, n * s, n * s * s, n * batch * (1 + k) + extra_tokens, n * batch)


def window(**parts: CellTotals) -> StepReading:
    """cells named like k2_b5 -> the cell of (k=2, B=5)."""
    out: dict[CellKey, CellTotals] = {}
    for name, t in parts.items():
        k, b = (int(x[1:]) for x in name.split("_"))
        key = cell_key(k, b)
        out[key] = out.get(key, CellTotals()) + t
    return StepReading(out)


def test_pure_decode_at_b_is_accepted_with_the_previous_ks_tail_and_a_switch() -> None:
    tail_and_new = window(k1_b5=steps(1, 5, 3), k2_b5=steps(2, 5, 20))
    tail_and_new = StepReading(tail_and_new.cells, 0, switch_steps=1)
    assert window_problem(tail_and_new, 5, 2) is None
    assert window_totals(tail_and_new, 5, 2, stream=False) == steps(2, 5, 20)
    # 8-wide cells: every step at exactly B=40
    assert window_problem(window(k3_b40=steps(3, 40, 16)), 40, 3) is None


@pytest.mark.parametrize(
    ("parts", "batch", "reason"),
    [
        ({}, 5, "no step in the window"),
        ({"k2_b5": steps(2, 5, 20, extra_tokens=64)}, 5, "+3.2 tokens per step beyond"),
        ({"k2_b5": steps(2, 5, 20), "k2_b6": steps(2, 6, 1)}, 5, "other batch sizes (6)"),
        ({"k2_b5": steps(2, 5, 20), "k1_b4": steps(1, 4, 2)}, 5, "other batch sizes (4)"),
        ({"k3_b40": steps(3, 40, 8) + steps(3, 39, 8)}, 40, "39.50 requests per step"),
    ],
)
def test_anything_but_b_requests_decoding_is_refused(
    parts: dict[str, CellTotals], batch: int, reason: str
) -> None:
    k = 3 if batch == 40 else 2
    problem = window_problem(window(**parts), batch, k)
    assert problem is not None and reason in problem


def test_prefill_only_steps_are_refused() -> None:
    plain = window(k0_b7=steps(0, 7, 10))
    problem = window_problem(StepReading(plain.cells, 1), 7, 0)
    assert problem == "B=7 k=0: steps at other batch sizes (1 prefill-only)"


def test_under_a_stream_arrivals_count_with_b_but_fewer_requests_do_not() -> None:
    arrivals = window(k1_b5=steps(1, 5, 30), k1_b6=steps(1, 6, 4, ms=9, extra_tokens=400))
    assert window_problem(arrivals, 5, 1, stream=True) is None
    assert window_problem(arrivals, 5, 1) is not None  # not pure decode
    both = window_totals(arrivals, 5, 1, stream=True)
    assert both.steps == 34 and both.tokens == 30 * 10 + 4 * 12 + 400
    short = window(k1_b5=steps(1, 5, 30), k1_b4=steps(1, 4, 2))
    problem = window_problem(short, 5, 1, stream=True)
    assert problem is not None and "other batch sizes (4)" in problem


@given(
    batch=st.integers(1, 300),
    k=st.integers(0, 4),
    n=st.integers(1, 200),
    other=st.integers(0, 300),
)
def test_exactly_b_decoding_passes_and_any_other_batch_at_k_fails(
    batch: int, k: int, n: int, other: int
) -> None:
    cells = {cell_key(k, batch): steps(k, batch, n)}
    assert window_problem(StepReading(cells), batch, k) is None
    if other >= 1 and other != batch:
        key = cell_key(k, other)
        cells[key] = cells.get(key, CellTotals()) + steps(k, other, 1)
        assert window_problem(StepReading(cells), batch, k) is not None


def test_a_window_is_broken_once_it_holds_wrong_steps_not_while_it_is_only_short() -> None:
    switching = StepReading(window(k1_b5=steps(1, 5, 3)).cells, 0, switch_steps=1)
    assert window_problem(switching, 5, 2) == "B=5 k=2: no step in the window"
    assert not window_broken(switching, 5, 2)  # the old k's tail: wait for steps at k=2
    ended = window(k1_b5=steps(1, 5, 3), k2_b4=steps(2, 4, 2))
    assert window_broken(ended, 5, 2)  # a request ended: waiting will not help
    assert window_broken(window(k3_b40=steps(3, 40, 1) + steps(3, 39, 1)), 40, 3)
    assert not window_broken(window(k2_b5=steps(2, 5, 3)), 5, 2)
