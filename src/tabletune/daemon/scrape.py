"""Direct-scrape parsing, pure: a /metrics text -> a ``Snapshot`` of counter totals; two
snapshots -> an ``Observation`` of increases, reset-aware. No network here."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from tabletune import metric_names as mn
from tabletune.daemon.observation import Observation
from tabletune.errors import InputError

OPENMETRICS_VLLM_PREFIX = "vllm_"

# The only samples read; every other line (HELP/TYPE, _created, step-duration buckets, other
# vLLM series) is dropped before parsing, which is most of a vLLM exposition.
WANTED = frozenset(
    {
        f"{mn.TT_DRAFT_TOKENS_PER_POS}_total",
        f"{mn.VLLM_ACCEPTED_PER_POS}_total",
        f"{mn.VLLM_NUM_DRAFTS}_total",
        f"{mn.VLLM_GENERATION_TOKENS}_total",
        f"{mn.TT_DECODE_BATCH_SIZE}_bucket",
        f"{mn.TT_DECODE_BATCH_SIZE}_sum",
        f"{mn.TT_DECODE_BATCH_SIZE}_count",
        f"{mn.TT_STEP_DURATION}_sum",
        f"{mn.TT_STEP_DURATION}_count",
        mn.VLLM_NUM_REQUESTS_RUNNING,
    }
)


def wanted_lines(text: str) -> str:
    """Only the sample lines the daemon reads, vLLM names spelled ``vllm:`` (OpenMetrics
    output from prometheus_client spells them ``vllm_``)."""
    return "\n".join(_wanted(text)) + "\n"


Sample = tuple[str, dict[str, str], float]


class SampleHeads:
    """Memo of sample heads (``name{labels}``) parsed by prometheus_client's parser.

    A replica prints the same heads every scrape; only the values change. Parsing each head
    once and reading values with ``float`` makes a 1,000-replica cycle affordable. Lines with a
    timestamp, or anything unusual, go through the parser whole.
    """

    def __init__(self, limit: int = 200_000) -> None:
        self._heads: dict[str, tuple[str, dict[str, str]]] = {}
        self._limit = limit

    def samples(self, text: str) -> list[Sample]:
        out: list[Sample] = []
        for line in _wanted(text):
            brace = line.rfind("}")
            cut = brace + 1 if brace >= 0 else line.find(" ")
            rest = line[cut:].split()
            if cut <= 0 or len(rest) != 1:
                out.extend(_parse(line))
                continue
            head = line[:cut]
            known = self._heads.get(head)
            if known is None:
                parsed = _parse(head + " 0")
                if len(parsed) != 1:
                    raise InputError(f"unreadable /metrics line: {line[:200]!r}")
                known = (parsed[0][0], parsed[0][1])
                if len(self._heads) >= self._limit:
                    self._heads.clear()  # label churn: start over rather than grow forever
                self._heads[head] = known
            try:
                value = float(rest[0])
            except ValueError:
                raise InputError(f"unreadable /metrics value: {line[:200]!r}") from None
            out.append((known[0], known[1], value))
        return out


def _parse(text: str) -> list[Sample]:
    try:
        return [
            (s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text + "\n")
            for s in family.samples
        ]
    except ValueError as error:
        raise InputError(f"unreadable /metrics text: {error}") from None


def _wanted(text: str) -> list[str]:
    kept = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith(OPENMETRICS_VLLM_PREFIX):
            line = "vllm:" + line[len(OPENMETRICS_VLLM_PREFIX) :]
        cut = len(line)
        for mark in ("{", " "):
            found = line.find(mark)
            if 0 <= found < cut:
                cut = found
        if line[:cut] in WANTED:
            kept.append(line)
    return kept


@dataclass(frozen=True)
class Snapshot:
    """Totals of one replica at one time, summed over its engines (data-parallel ranks)."""

    drafted: dict[int, float] = field(default_factory=dict)  # position -> total
    accepted: dict[int, float] = field(default_factory=dict)
    drafts: float = 0.0
    generated_tokens: float = 0.0
    batch_buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    batch_sum: float = 0.0
    batch_count: float = 0.0
    step_sum: dict[tuple[int, str], float] = field(default_factory=dict)
    step_count: dict[tuple[int, str], float] = field(default_factory=dict)
    running: float | None = None
    model_name: str | None = None


def _position(labels: dict[str, str]) -> int | None:
    raw = labels.get(mn.LABEL_POSITION)
    return int(raw) if raw is not None and raw.isdigit() else None


def parse_snapshot(text: str, *, heads: SampleHeads | None = None) -> Snapshot:
    """Parse a Prometheus text exposition (vLLM + plugin) into totals; InputError if garbled.

    ``heads`` (kept by the caller across scrapes) memoises label parsing."""
    drafted: dict[int, float] = defaultdict(float)
    accepted: dict[int, float] = defaultdict(float)
    buckets: dict[float, float] = defaultdict(float)
    step_sum: dict[tuple[int, str], float] = defaultdict(float)
    step_count: dict[tuple[int, str], float] = defaultdict(float)
    totals = {"drafts": 0.0, "tokens": 0.0, "batch_sum": 0.0, "batch_count": 0.0}
    running: float | None = None
    model: str | None = None
    samples = (heads or SampleHeads()).samples(text)
    for name, labels, value in samples:
        if math.isnan(value):
            continue
        if name == f"{mn.TT_DRAFT_TOKENS_PER_POS}_total":
            position = _position(labels)
            if position is not None:
                drafted[position] += value
        elif name == f"{mn.VLLM_ACCEPTED_PER_POS}_total":
            position = _position(labels)
            if position is not None:
                accepted[position] += value
            model = labels.get(mn.LABEL_MODEL, model)
        elif name == f"{mn.VLLM_NUM_DRAFTS}_total":
            totals["drafts"] += value
            model = labels.get(mn.LABEL_MODEL, model)
        elif name == f"{mn.VLLM_GENERATION_TOKENS}_total":
            totals["tokens"] += value
        elif name == f"{mn.TT_DECODE_BATCH_SIZE}_bucket":
            buckets[float(labels["le"])] += value
        elif name == f"{mn.TT_DECODE_BATCH_SIZE}_sum":
            totals["batch_sum"] += value
        elif name == f"{mn.TT_DECODE_BATCH_SIZE}_count":
            totals["batch_count"] += value
        elif name in (f"{mn.TT_STEP_DURATION}_sum", f"{mn.TT_STEP_DURATION}_count"):
            k_label = labels.get(mn.LABEL_K, "")
            if not k_label.isdigit():
                continue
            key = (int(k_label), labels.get(mn.LABEL_BATCH_BUCKET, ""))
            target = step_sum if name.endswith("_sum") else step_count
            target[key] += value
        elif name == mn.VLLM_NUM_REQUESTS_RUNNING:
            running = (running or 0.0) + value
    return Snapshot(
        drafted=dict(drafted),
        accepted=dict(accepted),
        drafts=totals["drafts"],
        generated_tokens=totals["tokens"],
        batch_buckets=dict(buckets),
        batch_sum=totals["batch_sum"],
        batch_count=totals["batch_count"],
        step_sum=dict(step_sum),
        step_count=dict(step_count),
        running=running,
        model_name=model,
    )


def _went_back(previous: Snapshot, current: Snapshot) -> bool:
    """Any counter below its previous value means the engine restarted (counters reset)."""
    pairs = [
        (previous.drafts, current.drafts),
        (previous.generated_tokens, current.generated_tokens),
        (previous.batch_count, current.batch_count),
    ]
    pairs += [(v, current.drafted.get(p, 0.0)) for p, v in previous.drafted.items()]
    pairs += [(v, current.accepted.get(p, 0.0)) for p, v in previous.accepted.items()]
    return any(now < before - 1e-9 for before, now in pairs)


def buckets_to_ranges(cumulative: dict[float, float]) -> dict[tuple[int, int], float]:
    """Cumulative ``le`` counts -> steps per inclusive integer batch range (low, high)."""
    out: dict[tuple[int, int], float] = {}
    previous_le = 0.0
    previous_count = 0.0
    for le in sorted(cumulative):
        count = cumulative[le] - previous_count
        low = math.floor(previous_le) + 1
        high = low if math.isinf(le) else math.floor(le)
        if count > 0 and high >= low:
            out[(low, high)] = out.get((low, high), 0.0) + count
        previous_count = cumulative[le]
        if not math.isinf(le):
            previous_le = le
    return out


def observe_delta(
    previous: Snapshot,
    current: Snapshot,
    *,
    replica: str,
    admin_url: str,
    interval_s: float,
) -> Observation:
    """Increases from ``previous`` to ``current``; after a reset the current totals are the
    increase (the counters restarted from zero)."""
    reset = _went_back(previous, current)
    base = Snapshot() if reset else previous

    def diff(now: float, before: float) -> float:
        return max(0.0, now - before)

    size = max([*current.drafted, *current.accepted, -1]) + 1
    drafted = tuple(
        diff(current.drafted.get(p, 0.0), base.drafted.get(p, 0.0)) for p in range(size)
    )
    accepted = tuple(
        diff(current.accepted.get(p, 0.0), base.accepted.get(p, 0.0)) for p in range(size)
    )
    cumulative = {
        le: diff(count, base.batch_buckets.get(le, 0.0))
        for le, count in current.batch_buckets.items()
    }
    batch_count = diff(current.batch_count, base.batch_count)
    mean_batch: float | None = None
    if batch_count > 0:
        mean_batch = diff(current.batch_sum, base.batch_sum) / batch_count
    elif current.running is not None:
        mean_batch = current.running
    step_times = {
        key: (
            diff(current.step_sum.get(key, 0.0), base.step_sum.get(key, 0.0)),
            diff(count, base.step_count.get(key, 0.0)),
        )
        for key, count in current.step_count.items()
    }
    return Observation(
        replica=replica,
        admin_url=admin_url,
        interval_s=interval_s,
        drafted=drafted,
        accepted=accepted,
        load_buckets=buckets_to_ranges(cumulative),
        mean_batch=mean_batch,
        generated_tokens=diff(current.generated_tokens, base.generated_tokens),
        step_times={key: value for key, value in step_times.items() if value[1] > 0},
        reset=reset,
        model_name=current.model_name,
    )
