"""The embedded default source: scrape each replica's /metrics directly (no Prometheus).

The first scrape of a replica only sets its baseline; later scrapes report increases since the
previous one (see ``scrape.observe_delta``). Replicas are scraped side by side
(``daemon.replica_io``), each request within ``SOURCE__TIMEOUT_S``, all within the first half
of the cycle's budget: a failed, garbled or timed-out answer is that replica's problem, never
the others'. Scrapes the daemon had no time to send or wait for (it is behind) are not a
replica's problem: those replicas are left out of this cycle and scraped first in the next.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial

import httpx
import structlog

from tabletune.daemon.deadlines import CycleBudget
from tabletune.daemon.observation import Observation, SourceResult
from tabletune.daemon.replica_io import ReplicaIo
from tabletune.daemon.scrape import SampleHeads, Snapshot, observe_delta, parse_snapshot
from tabletune.daemon.settings import SourceSettings, mask_credentials
from tabletune.errors import InputError, TableTuneError

DEFAULT_WORKERS = 16
log = structlog.get_logger("tabletune.daemon")


class DirectSource:
    """Scrapes ``<replica>/metrics`` for a static list of replica base URLs."""

    def __init__(
        self,
        *,
        settings: SourceSettings,
        replicas: Sequence[str] | None = None,
        transport: httpx.BaseTransport | None = None,
        fetch: Callable[[str], str] | None = None,
        io: ReplicaIo | None = None,
        budget_s: float = math.inf,
    ) -> None:
        """``fetch(replica) -> /metrics text`` replaces HTTP (benchmarks on the emulator's
        core); it raises InputError when the replica cannot be read. ``budget_s``: the
        cycle's budget, which a scrape's deadline never passes."""
        self._replicas = tuple(url.rstrip("/") for url in (replicas or settings.replicas))
        self._stale_after_s = settings.stale_after_s
        self._timeout_s = settings.timeout_s
        self._budget_s = budget_s
        self._io = io or ReplicaIo(workers=DEFAULT_WORKERS)
        limits = httpx.Limits(
            max_connections=self._io.workers, max_keepalive_connections=self._io.workers
        )
        self._http = httpx.Client(timeout=settings.timeout_s, transport=transport, limits=limits)
        self._last: dict[str, tuple[float, Snapshot]] = {}
        self._fetch = fetch or self._http_text
        self._heads = SampleHeads()
        self._first = 0  # where the next round of scrapes starts (those left out go first)

    @property
    def replicas(self) -> tuple[str, ...]:
        return self._replicas

    def close(self) -> None:
        self._http.close()

    def has_baseline(self) -> bool:
        return all(replica in self._last for replica in self._replicas)

    def forget(self, replica: str) -> None:
        """Drop the replica's baseline: when it has data again, it starts afresh."""
        self._last.pop(replica, None)

    def _http_text(self, replica: str) -> str:
        try:
            response = self._http.get(f"{replica}/metrics")
            response.raise_for_status()
        except httpx.HTTPError as error:
            message = f"{replica}/metrics: {type(error).__name__}: {error}"
            raise InputError(mask_credentials(message)) from None
        return response.text

    def _scrape(self, replica: str) -> Snapshot:
        return parse_snapshot(self._fetch(replica), heads=self._heads)

    def collect(self, now: float, *, on_replica: Callable[[], bool] | None = None) -> SourceResult:
        """Scrape every replica at once; ``on_replica`` returning False abandons those not yet
        answered (shutdown). Each snapshot is stamped with when its answer came."""
        started = self._io.monotonic()
        budget = CycleBudget(started=started, deadline=started + self._budget_s)
        scrapes = self._io.round(
            "scrape",
            deadline=budget.scrape_deadline(),
            patience_s=self._timeout_s,
            stopped=(lambda: not on_replica()) if on_replica is not None else lambda: False,
        )
        answered: dict[str, tuple[float, Snapshot]] = {}
        problems: dict[str, str] = {}

        def done(replica: str) -> Callable[[Snapshot], None]:
            def keep(snapshot: Snapshot) -> None:
                answered[replica] = (now + self._io.monotonic() - started, snapshot)

            return keep

        def failed(replica: str) -> Callable[[TableTuneError], None]:
            def note(error: TableTuneError) -> None:
                problems[replica] = str(error)

            return note

        order = self._replicas[self._first :] + self._replicas[: self._first]
        for replica in order:
            if not scrapes.submit(
                replica,
                partial(self._scrape, replica),
                done=done(replica),
                failed=failed(replica),
            ):
                problems[replica] = mask_credentials(
                    f"{replica}/metrics: the previous scrape has not ended"
                )
        left = scrapes.wait()
        if on_replica is None or on_replica():  # on shutdown the unanswered are abandoned
            for replica in left.late:
                problems[replica] = mask_credentials(
                    f"{replica}/metrics: no answer within {scrapes.deadline - started:.3g} s"
                )
        if left.unjudged:
            first = min(order.index(replica) for replica in left.unjudged)
            self._first = self._replicas.index(order[first])
            log.warning(
                "scrapes left for the next cycle: no time to wait for them",
                replicas=len(left.unjudged),
                window_s=round(scrapes.deadline - started, 3),
            )
        observations: dict[str, Observation] = {}
        for replica in self._replicas:
            if replica not in answered:
                continue
            at, snapshot = answered[replica]
            previous = self._last.get(replica)
            self._last[replica] = (at, snapshot)
            if previous is None:
                continue  # baseline only
            then, before = previous
            if at - then > self._stale_after_s:
                problems[replica] = f"previous scrape is {at - then:.0f} s old; new baseline"
                continue
            observations[replica] = observe_delta(
                before,
                snapshot,
                replica=replica,
                admin_url=replica,
                interval_s=max(at - then, 1e-9),
            )
        return SourceResult(observations=observations, problems=problems)
