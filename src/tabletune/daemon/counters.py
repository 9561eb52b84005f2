"""The counters the daemon reads, and how their increases over one window become an
``Observation``. Pure; both sources (direct scrape, Prometheus) end here.

A counter series is keyed by its family (the sample name, ``_total`` included, vLLM's names
spelled ``vllm:``), its engine and the labels the daemon groups by (position, k, batch); every
other label (model, instance, job) is dropped. Engines are summed only here, after each
engine's increase was taken on its own, so one engine's reset cannot hide in a sum.
"""

from __future__ import annotations

from collections.abc import Mapping

from tabletune import metric_names as mn
from tabletune.daemon.observation import Observation
from tabletune.step_cells import CellKey, CellTotals, merge_cells, parse_cell_label

DRAFTED = f"{mn.TT_DRAFT_TOKENS_PER_POS}_total"
ACCEPTED = f"{mn.VLLM_ACCEPTED_PER_POS}_total"
GENERATED = f"{mn.VLLM_GENERATION_TOKENS}_total"
WITHOUT_DECODE = f"{mn.TT_STEPS_WITHOUT_DECODE}_total"
# cell family -> the CellTotals field it sums
CELL_FIELDS: Mapping[str, str] = {
    f"{mn.TT_STEPS}_total": "steps",
    f"{mn.TT_STEP_SECONDS}_total": "seconds",
    f"{mn.TT_STEP_SECONDS_SQUARED}_total": "seconds_sq",
    f"{mn.TT_STEP_TOKENS}_total": "tokens",
    f"{mn.TT_STEP_REQUESTS}_total": "requests",
}
COUNTERS: tuple[str, ...] = (DRAFTED, ACCEPTED, GENERATED, *CELL_FIELDS, WITHOUT_DECODE)
RUNNING = mn.VLLM_NUM_REQUESTS_RUNNING  # gauge: the load when no step cell is exported

# Series whose value is the time the process (or the engine's counters) started: a new value
# is a restart even when every counter has already climbed past its old value.
# ``process_start_time_seconds`` is vLLM's API server's (absent in multi-process mode);
# ``_created`` samples are ingested by Prometheus 2 and written by prometheus_client.
START_SERIES: tuple[str, ...] = (
    "process_start_time_seconds",
    f"{mn.VLLM_GENERATION_TOKENS}_created",
    f"{mn.TT_STEPS_WITHOUT_DECODE}_created",
)

OPENMETRICS_VLLM_PREFIX = "vllm_"
VLLM_PREFIX = "vllm:"

CounterKey = tuple[str, str, str, str, str]  # (family, engine, position, k, batch); "" absent
KEY_LABELS = (mn.LABEL_ENGINE, mn.LABEL_POSITION, mn.LABEL_K, mn.LABEL_BATCH)
Increases = Mapping[CounterKey, float]


def canonical_name(name: str) -> str:
    """vLLM's ``vllm:`` spelling for a sample name; prometheus_client's OpenMetrics output
    (what Prometheus asks for) writes ``vllm_`` instead."""
    if name.startswith(OPENMETRICS_VLLM_PREFIX):
        return VLLM_PREFIX + name[len(OPENMETRICS_VLLM_PREFIX) :]
    return name


def both_spellings(name: str) -> tuple[str, ...]:
    """The names a series may carry in Prometheus (without the shipped relabel rule)."""
    if name.startswith(VLLM_PREFIX):
        return (name, OPENMETRICS_VLLM_PREFIX + name[len(VLLM_PREFIX) :])
    return (name,)


def counter_key(family: str, labels: Mapping[str, str]) -> CounterKey:
    engine, position, k, batch = (labels.get(label, "") for label in KEY_LABELS)
    return (family, engine, position, k, batch)


def _per_position(increases: Increases, family: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for (name, _, position, _, _), value in increases.items():
        if name == family and position.isdigit():
            out[int(position)] = out.get(int(position), 0.0) + value
    return out


def step_cells_of(increases: Increases) -> dict[CellKey, CellTotals]:
    """The step cells in ``increases``, each engine's cells built apart, then merged; cells
    without a step are left out. Series whose k or batch label is not a cell's are ignored,
    as any series the daemon does not know."""
    per_engine: dict[str, dict[CellKey, dict[str, float]]] = {}
    for (family, engine, _, k, batch), value in increases.items():
        field = CELL_FIELDS.get(family)
        if field is None or not k.isdigit():
            continue
        try:
            low, high = parse_cell_label(batch)
        except ValueError:
            continue
        fields = per_engine.setdefault(engine, {}).setdefault((int(k), low, high), {})
        fields[field] = value
    merged = merge_cells(
        {key: CellTotals(**fields) for key, fields in cells.items()}
        for cells in per_engine.values()
    )
    return {key: totals for key, totals in merged.items() if totals.steps > 0}


def mean_batch_of(cells: Mapping[CellKey, CellTotals]) -> float | None:
    """Σ scheduled requests / Σ steps over every cell: the mean batch size of the steps that
    decoded; None without a step."""
    steps = sum(t.steps for t in cells.values())
    return sum(t.requests for t in cells.values()) / steps if steps > 0 else None


def observation_from(
    increases: Increases,
    *,
    replica: str,
    admin_url: str,
    interval_s: float,
    running: float | None,
    reset: bool,
    model_name: str | None,
) -> Observation:
    """The observation of one replica from its counters' increases over the window (each
    engine's series apart) and the mean of its running-requests gauge (None if unknown)."""
    drafted = _per_position(increases, DRAFTED)
    accepted = _per_position(increases, ACCEPTED)
    size = max([*drafted, *accepted, -1]) + 1
    cells = step_cells_of(increases)
    mean_batch = mean_batch_of(cells)
    return Observation(
        replica=replica,
        admin_url=admin_url,
        interval_s=interval_s,
        drafted=tuple(drafted.get(p, 0.0) for p in range(size)),
        accepted=tuple(accepted.get(p, 0.0) for p in range(size)),
        mean_batch=running if mean_batch is None else mean_batch,
        generated_tokens=sum(v for key, v in increases.items() if key[0] == GENERATED),
        step_cells=cells,
        steps_without_decode=sum(v for key, v in increases.items() if key[0] == WITHOUT_DECODE),
        reset=reset,
        model_name=model_name,
    )
