"""The Prometheus source at scale against a real Prometheus, written to
bench/results/prometheus_source_bench.json.

N replicas (Prometheus targets; one exporter answers for all of them, each target its own
``?replica=`` page, as blackbox-style relabelling does) expose vLLM's counters and the plugin's
step cells: ``--cells`` cells per replica of which ``--active`` grow (the rest keep their
totals, as cells visited earlier in the day do). Timed: the source's ``collect`` (wall time,
the time Prometheus took to answer, the number of queries) in two steady cycles and in one
where 10 % of the replicas restarted (those are counted from their raw samples). Goal for
1,000 replicas: a cycle of a couple of seconds.

    .venv/bin/python bench/prometheus_source_bench.py                  # 1,000 replicas
    .venv/bin/python bench/prometheus_source_bench.py --replicas 100   # a quick run
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from tests.support.servers import TextServer, free_port, prometheus  # noqa: E402

from bench.common import environment, write_result  # noqa: E402
from tabletune import metric_names as mn  # noqa: E402
from tabletune.daemon.counters import CELL_FIELDS  # noqa: E402
from tabletune.daemon.prometheus_http import PrometheusHttp, QueryApi  # noqa: E402
from tabletune.daemon.prometheus_source import PrometheusSource  # noqa: E402
from tabletune.daemon.settings import load_settings  # noqa: E402
from tabletune.step_cells import cell_label, cells_up_to  # noqa: E402

WINDOW_S = 15.0
RESTARTED_SHARE = 0.1


class Replicas:
    """Every replica's counters as functions of time: rates per second since its start."""

    def __init__(self, count: int, cells: int, active: int) -> None:
        self.starts = [time.time() - 3600.0 - i for i in range(count)]
        every = cells_up_to(256)
        self.cells = [(3 if i % 2 else 1, every[i % len(every)]) for i in range(cells)]
        self.active = active
        self.lock = threading.Lock()

    def restart(self, replicas: range) -> None:
        with self.lock:
            for i in replicas:
                self.starts[i] = time.time()

    def text(self, i: int) -> bytes:
        with self.lock:
            start = self.starts[i]
        up_s = time.time() - start
        engine = 'engine="0",model_name="m"'
        lines = [
            f"process_start_time_seconds {start:.3f}",
            f"{mn.VLLM_GENERATION_TOKENS}_total{{{engine}}} {int(up_s * 900)}",
            f"{mn.VLLM_GENERATION_TOKENS}_created{{{engine}}} {start:.3f}",
            f"{mn.VLLM_NUM_REQUESTS_RUNNING}{{{engine}}} 40",
            f"{mn.TT_STEPS_WITHOUT_DECODE}_total{{{engine}}} {int(up_s)}",
            f"{mn.TT_STEPS_WITHOUT_DECODE}_created{{{engine}}} {start:.3f}",
        ]
        for position in range(3):
            drafted = int(up_s * 400)
            lines.append(
                f'{mn.TT_DRAFT_TOKENS_PER_POS}_total{{{engine},position="{position}"}} {drafted}'
            )
            lines.append(
                f'{mn.VLLM_ACCEPTED_PER_POS}_total{{{engine},position="{position}"}} '
                f"{int(drafted * 0.7 ** (position + 1))}"
            )
        for index, (k, cell) in enumerate(self.cells):
            steps = int(up_s * 10) if index < self.active else 1000
            labels = f'{engine},k="{k}",batch="{cell_label(cell)}"'
            for family, field in CELL_FIELDS.items():
                per_step = {"steps": 1, "seconds": 0.02, "seconds_sq": 0.0004}.get(field, cell[0])
                lines.append(f"{family}{{{labels}}} {steps * per_step}")
        return ("\n".join(lines) + "\n").encode()


@contextmanager
def exporter(replicas: Replicas) -> Iterator[int]:
    """One server answering for every replica: ``/metrics?replica=r<i>``."""

    def page(path: str) -> bytes:
        replica = parse_qs(urlsplit(path).query)["replica"][0]
        return replicas.text(int(replica.removeprefix("r")))

    port = free_port()
    server = TextServer(port, page)
    try:
        yield port
    finally:
        server.stop()


def prometheus_config(count: int, port: int, scrape_s: float) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": f"{scrape_s:g}s", "scrape_timeout": f"{scrape_s:g}s"},
        "scrape_configs": [
            {
                "job_name": "vllm",
                "static_configs": [{"targets": [f"r{i}" for i in range(count)]}],
                "relabel_configs": [
                    {"source_labels": ["__address__"], "target_label": "__param_replica"},
                    {"source_labels": ["__param_replica"], "target_label": "instance"},
                    {"target_label": "__address__", "replacement": f"127.0.0.1:{port}"},
                ],
                "metric_relabel_configs": [mn.VLLM_NAME_RELABEL],
            }
        ],
    }


class Timed:
    """The source's query API, timing each query (named by its kind and first family)."""

    def __init__(self, api: QueryApi) -> None:
        self.api = api
        self.seconds: dict[str, float] = {}

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        began = time.perf_counter()
        try:
            return self.api.custom_query(query, params)
        finally:
            family = re.search(r'__name__=~"([^"|]+)', query)
            kind = "raw" if query.endswith("]") else query.split(" (")[0]
            name = f"{kind} {family.group(1) if family else ''}"
            self.seconds[name] = round(time.perf_counter() - began, 3)


def cycle(source: PrometheusSource, timed: Timed, at: float) -> dict[str, Any]:
    timed.seconds.clear()
    began = time.perf_counter()
    result = source.collect(at)
    wall = time.perf_counter() - began
    return {
        "wall_s": round(wall, 3),
        "queries": len(timed.seconds),
        "slowest_queries_s": dict(sorted(timed.seconds.items(), key=lambda kv: -kv[1])[:4]),
        "observed": len(result.observations),
        "reset": sum(o.reset for o in result.observations.values()),
        "problems": len(result.problems),
        "problem_examples": sorted(set(result.problems.values()))[:3],
    }


def timed_source(url: str, last_evaluation: float) -> tuple[PrometheusSource, Timed]:
    settings = load_settings(
        {
            "TABLETUNE_SOURCE__PROMETHEUS_URL": url,
            "TABLETUNE_SOURCE__TIMEOUT_S": "60",
            "TABLETUNE_SOURCE__QUERY_DELAY_S": "0",
        }
    ).source
    timed = Timed(PrometheusHttp(settings))
    return PrometheusSource(settings=settings, api=timed, last_evaluation=last_evaluation), timed


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--cells", type=int, default=24, help="step cells per replica")
    parser.add_argument("--active", type=int, default=3, help="cells that grow")
    parser.add_argument("--scrape-s", type=float, default=5.0)
    parser.add_argument("--out", default="prometheus_source_bench")
    args = parser.parse_args()
    replicas = Replicas(args.replicas, args.cells, args.active)
    live: dict[str, Any] = {}
    quiet: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory() as work,
        exporter(replicas) as port,
        prometheus(
            Path(work), config=prometheus_config(args.replicas, port, args.scrape_s)
        ) as prom,
    ):
        prom.wait_for_targets_up(count=args.replicas, timeout_s=120)
        time.sleep(WINDOW_S + 3 * args.scrape_s)  # a window and its base in Prometheus
        series = prom.query_value("count({__name__=~'.+', job='vllm'})")
        # Live: while Prometheus scrapes every replica (on the same cores here).
        ends = [time.time()]
        source, timed = timed_source(prom.url, ends[0] - WINDOW_S)
        live["steady_1"] = cycle(source, timed, ends[-1])
        time.sleep(WINDOW_S)
        ends.append(time.time())
        live["steady_2"] = cycle(source, timed, ends[-1])
        replicas.restart(range(int(args.replicas * RESTARTED_SHARE)))
        time.sleep(WINDOW_S)
        ends.append(time.time())
        live["restarts"] = cycle(source, timed, ends[-1])
        # Quiet: the same windows again once scraping stopped (the query cost alone).
        time.sleep(args.scrape_s)
        prom.config_path.write_text(yaml.safe_dump({"global": {}, "scrape_configs": []}))
        prom.reload()
        time.sleep(2.0)
        source, timed = timed_source(prom.url, ends[0] - WINDOW_S)
        for name, end in zip(("steady_1", "steady_2", "restarts"), ends, strict=True):
            quiet[name] = cycle(source, timed, end)
    payload = {
        **environment(),
        "prometheus": "2.42 (Debian) on the same 2 shared cores as the daemon and the exporter",
        "replicas": args.replicas,
        "cells_per_replica": args.cells,
        "active_cells_per_replica": args.active,
        "series_in_prometheus": series,
        "scrape_interval_s": args.scrape_s,
        "window_s": WINDOW_S,
        "restarted_share": RESTARTED_SHARE,
        "cycles_while_scraping": live,
        "cycles_scraping_stopped": quiet,
        "goal": "a cycle of a couple of seconds for 1,000 replicas",
    }
    print(json.dumps(payload, indent=2))
    write_result(args.out, payload)


if __name__ == "__main__":
    main()
