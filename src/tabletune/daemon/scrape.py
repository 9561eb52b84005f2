"""Direct-scrape parsing, pure: a /metrics text -> a ``Snapshot`` of counter totals; two
snapshots -> an ``Observation`` of increases, restart-aware. No network here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from tabletune.daemon.counters import (
    COUNTERS,
    RUNNING,
    START_SERIES,
    CounterKey,
    canonical_name,
    counter_key,
    observation_from,
)
from tabletune.daemon.observation import Observation
from tabletune.errors import InputError

# The only samples read; every other line (HELP/TYPE, other _created samples, other vLLM
# series) is dropped before parsing, which is most of a vLLM exposition.
WANTED = frozenset({*COUNTERS, RUNNING, *START_SERIES})

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
        line = canonical_name(line)
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
    """Totals of one replica at one time: each engine's counter series apart."""

    totals: dict[CounterKey, float] = field(default_factory=dict)
    starts: dict[CounterKey, float] = field(default_factory=dict)  # START_SERIES values
    running: float | None = None  # running requests, summed over engines
    model_name: str | None = None


def parse_snapshot(text: str, *, heads: SampleHeads | None = None) -> Snapshot:
    """Parse a Prometheus text exposition (vLLM + plugin) into totals; InputError if garbled.

    ``heads`` (kept by the caller across scrapes) memoises label parsing."""
    totals: dict[CounterKey, float] = {}
    starts: dict[CounterKey, float] = {}
    running: float | None = None
    model: str | None = None
    for name, labels, value in (heads or SampleHeads()).samples(text):
        if math.isnan(value):
            continue
        key = counter_key(name, labels)
        if name == RUNNING:
            running = (running or 0.0) + value
        elif name in START_SERIES:
            starts[key] = value
        else:
            totals[key] = totals.get(key, 0.0) + value
            model = labels.get("model_name", model)
    return Snapshot(totals=totals, starts=starts, running=running, model_name=model)


def restarted(previous: Snapshot, current: Snapshot) -> bool:
    """The engine restarted between the two reads: a start time changed, a counter went back,
    or a series it had is gone (counters never disappear from a running process)."""
    if any(current.starts.get(key, value) != value for key, value in previous.starts.items()):
        return True
    return any(
        key not in current.totals or current.totals[key] < value - 1e-9
        for key, value in previous.totals.items()
    )


def observe_delta(
    previous: Snapshot,
    current: Snapshot,
    *,
    replica: str,
    admin_url: str,
    interval_s: float,
) -> Observation:
    """Increases from ``previous`` to ``current``; after a restart the current totals are the
    increase (the counters restarted from zero)."""
    reset = restarted(previous, current)
    base = {} if reset else previous.totals
    increases = {key: value - base.get(key, 0.0) for key, value in current.totals.items()}
    return observation_from(
        increases,
        replica=replica,
        admin_url=admin_url,
        interval_s=interval_s,
        running=current.running,
        reset=reset,
        model_name=current.model_name,
    )
