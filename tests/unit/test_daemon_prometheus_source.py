"""The Prometheus source's plan, against canned answers (the real Prometheus is in the
integration tests): which windows Prometheus's differences count, which go to the raw samples,
and that a suspicion alone never reports a restart."""

from __future__ import annotations

import re
from typing import Any

from tabletune.daemon.counters import DRAFTED
from tabletune.daemon.prometheus_source import PrometheusSource
from tabletune.daemon.settings import load_settings

T = 1_000.0  # scrapes every second from T
AT = T + 30.0  # the window (T + 15, T + 30]
TARGET = {"instance": "r1", "job": "vllm"}
ENGINE = {**TARGET, "engine": "0", "model_name": "m"}


def matrix(labels: dict[str, str], samples: list[tuple[float, float]]) -> dict[str, Any]:
    return {"metric": labels, "values": [[ts, str(v)] for ts, v in samples]}


def vector(labels: dict[str, str], value: float) -> dict[str, Any]:
    return {"metric": labels, "value": [AT, str(value)]}


class Canned:
    """Answers by query kind: the targets' samples, per-family differences, the running mean,
    the counters-went-back scan, per-family raw samples."""

    def __init__(self, answers: dict[tuple[str, str], list[dict[str, Any]]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, str]] = []

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        family = re.search(r'__name__=~"([^"|]+)', query)
        name = family.group(1) if family else ""
        if "|up|" in query:
            kind, name = "targets", ""
        elif query.startswith("count by"):
            kind, name = "went back", ""
        elif "avg_over_time" in query:
            kind = "running"
        elif query.startswith("sum by"):
            kind = "difference"
        else:
            kind = "raw"
        self.asked.append((kind, name))
        return self.answers.get((kind, name), [])


def targets(*, up: list[float] | None = None) -> list[dict[str, Any]]:
    every = [(T + i, 1.0) for i in range(31)] if up is None else list(zip(
        [T + i for i in range(31)], up, strict=True
    ))  # fmt: skip
    return [
        matrix({**TARGET, "__name__": "up"}, every),
        matrix({**ENGINE, "__name__": "vllm:generation_tokens_total"}, [(T + 30, 5.0)]),
    ]


def source(canned: Canned) -> PrometheusSource:
    settings = load_settings(
        {
            "TABLETUNE_SOURCE__PROMETHEUS_URL": "http://prom:9090",
            "TABLETUNE_SOURCE__QUERY_DELAY_S": "0",
        }
    ).source
    return PrometheusSource(settings=settings, api=canned, last_evaluation=T + 15.0)


def test_a_clean_window_is_counted_by_prometheus_differences() -> None:
    canned = Canned(
        {
            ("targets", ""): targets(),
            ("difference", DRAFTED): [vector({**ENGINE, "position": "0"}, 120.0)],
            ("running", "vllm:num_requests_running"): [vector(TARGET, 7.0)],
        }
    )
    obs = source(canned).collect(AT).observations["r1"]
    assert obs.drafted == (120.0,) and obs.mean_batch == 7.0 and not obs.reset
    assert obs.model_name == "m" and obs.interval_s == 15.0
    assert ("raw", DRAFTED) not in canned.asked


def test_a_counter_gone_back_before_the_base_sends_to_raw_but_is_no_restart() -> None:
    drafted = {**ENGINE, "position": "0"}
    canned = Canned(
        {
            ("targets", ""): targets(),
            ("difference", DRAFTED): [vector(drafted, 120.0)],
            ("went back", ""): [vector({"instance": "r1"}, 1.0)],  # e.g. at T + 14.5
            ("raw", DRAFTED): [matrix(drafted, [(T + 14, 3.0), (T + 15, 80.0), (T + 30, 200.0)])],
        }
    )
    obs = source(canned).collect(AT).observations["r1"]
    assert obs.drafted == (120.0,) and not obs.reset


def test_a_counter_gone_back_inside_the_window_is_a_restart_counted_from_zero() -> None:
    drafted = {**ENGINE, "position": "0"}
    canned = Canned(
        {
            ("targets", ""): targets(),
            ("difference", DRAFTED): [vector(drafted, -60.0)],
            ("raw", DRAFTED): [matrix(drafted, [(T + 15, 80.0), (T + 20, 90.0), (T + 30, 20.0)])],
        }
    )
    obs = source(canned).collect(AT).observations["r1"]
    assert obs.drafted == (30.0,) and obs.reset


def test_refused_and_vanished_replicas_are_problems() -> None:
    up = [1.0] * 16 + [0.0] * 15  # down for the whole window
    canned = Canned({("targets", ""): targets(up=up)})
    src = source(canned)
    first = src.collect(AT)
    assert first.observations == {} and "down" in first.problems["r1"]
    canned.answers[("targets", "")] = []  # Prometheus no longer has the target at all
    gone = src.collect(AT + 15.0)
    assert "no samples" in gone.problems["r1"]
