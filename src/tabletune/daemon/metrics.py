"""The daemon's own metrics (``tabletune_daemon_*``, its own registry) and its small HTTP
server: ``/metrics`` for Prometheus, ``/healthz`` for probes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from tabletune.errors import InputError
from tabletune.schemas.table import Range
from tabletune.step_cells import cell_label

PREFIX = "tabletune_daemon"


class DaemonMetrics:
    """Every series the daemon exports; documented in docs/daemon.md."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._ranges: dict[str, list[tuple[str, str]]] = {}
        r = self.registry
        self.cycles = Counter(f"{PREFIX}_cycles", "Evaluation cycles run", ["outcome"], registry=r)
        self.cycle_seconds = Gauge(
            f"{PREFIX}_cycle_duration_seconds", "Duration of the last cycle", registry=r
        )
        self.last_cycle = Gauge(
            f"{PREFIX}_last_cycle_timestamp_seconds", "When the last cycle ended", registry=r
        )
        self.errors = Counter(f"{PREFIX}_errors", "Errors by kind", ["kind"], registry=r)
        self.table_version = Gauge(
            f"{PREFIX}_table_version", "Table version seen on the replica", ["replica"], registry=r
        )
        self.range_k = Gauge(
            f"{PREFIX}_table_range_k",
            "k of each range of the replica's table",
            ["replica", "range_start", "range_end"],
            registry=r,
        )
        self.acceptance = Gauge(
            f"{PREFIX}_acceptance_estimate",
            "a_hat_i: chance that the first i guesses are all accepted",
            ["unit", "position"],
            registry=r,
        )
        self.acceptance_prior = Gauge(
            f"{PREFIX}_acceptance_prior", "a_i of the prior", ["unit", "position"], registry=r
        )
        self.last_push = Gauge(
            f"{PREFIX}_last_push_timestamp_seconds",
            "When a table was last pushed to the replica",
            ["replica"],
            registry=r,
        )
        self.pushes = Counter(
            f"{PREFIX}_pushes", "Table pushes by outcome", ["replica", "outcome"], registry=r
        )
        self.rollbacks = Counter(
            f"{PREFIX}_rollbacks", "Tables rolled back by the guard", ["replica"], registry=r
        )
        self.predicted_gain = Gauge(
            f"{PREFIX}_predicted_gain_ratio",
            "Predicted goodput change of the best table over the running one (recent load)",
            ["replica"],
            registry=r,
        )
        self.step_time_ratio = Gauge(
            f"{PREFIX}_step_time_ratio",
            "Live step time / profile T at the same k and batch cell (recent steps)",
            ["replica", "k", "batch"],
            registry=r,
        )
        self._ratio_cells: dict[str, set[tuple[str, str]]] = {}
        self.stale = Gauge(
            f"{PREFIX}_replica_stale",
            "1 while the replica's data is stale or missing",
            ["replica"],
            registry=r,
        )
        self.alerts = Gauge(
            f"{PREFIX}_alert_firing",
            "1 while a condition alert is firing",
            ["alertname", "replica", "pool"],
            registry=r,
        )

    def set_table(self, replica: str, ranges: Sequence[Range], version: int) -> None:
        """Replace the replica's range series (old ranges disappear)."""
        for old_start, old_end in self._ranges.pop(replica, ()):
            self.range_k.remove(replica, old_start, old_end)
        shown = []
        for start, end, k in ranges:
            self.range_k.labels(replica, str(start), str(end)).set(k)
            shown.append((str(start), str(end)))
        self._ranges[replica] = shown
        self.table_version.labels(replica).set(version)

    def set_step_time_ratios(
        self, replica: str, cells: Sequence[tuple[int, tuple[int, int], float]]
    ) -> None:
        """Replace the replica's live/profile ratios with those of ``(k, cell, ratio)``."""
        current = {(str(k), cell_label(cell)): ratio for k, cell, ratio in cells}
        for stale in self._ratio_cells.pop(replica, set()) - set(current):
            self.step_time_ratio.remove(replica, *stale)
        for (k, batch), ratio in current.items():
            self.step_time_ratio.labels(replica, k, batch).set(ratio)
        self._ratio_cells[replica] = set(current)

    def forget(self, replica: str) -> None:
        """Remove every series of the replica: each family labelled ``replica``, and the
        acceptance families of its own estimator unit (``unit`` = the replica)."""
        self._ranges.pop(replica, None)
        self._ratio_cells.pop(replica, None)
        for family, label in self.per_replica():
            labelsets = {
                tuple(sample.labels.values())  # in the family's label order
                for metric in family.collect()
                for sample in metric.samples
                if sample.labels.get(label) == replica
            }
            for labelset in labelsets:
                family.remove(*labelset)

    def per_replica(self) -> list[tuple[Counter | Gauge, str]]:
        """The families whose series belong to one replica, and the label that names it."""
        by_replica: list[Counter | Gauge] = [
            self.table_version,
            self.range_k,
            self.last_push,
            self.pushes,
            self.rollbacks,
            self.predicted_gain,
            self.step_time_ratio,
            self.stale,
            self.alerts,
        ]
        return [(f, "replica") for f in by_replica] + [
            (self.acceptance, "unit"),
            (self.acceptance_prior, "unit"),
        ]

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.registry.get_sample_value(name, labels or {})


class MetricsServer:
    """A thread serving /metrics and /healthz (200 when ``healthy()``, else 503)."""

    def __init__(
        self, *, registry: CollectorRegistry, healthy: Callable[[], bool], host: str, port: int
    ) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/metrics":
                    body, status, kind = generate_latest(registry), 200, CONTENT_TYPE_LATEST
                elif self.path.split("?")[0] == "/healthz":
                    ok = healthy()
                    body = b"ok\n" if ok else b"unhealthy: no cycle lately\n"
                    status, kind = (200 if ok else 503), "text/plain"
                else:
                    body, status, kind = b"not found\n", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # probes every few seconds would flood the logs

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as error:  # a busy port or a wrong address: the configuration's fault
            raise InputError(
                f"cannot serve /metrics on {host}:{port}: {error.strerror or error} "
                "(TABLETUNE_SERVER__HOST, TABLETUNE_SERVER__PORT)"
            ) from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
