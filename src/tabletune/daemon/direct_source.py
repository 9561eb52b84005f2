"""The embedded default source: scrape each replica's /metrics directly (no Prometheus).

The first scrape of a replica only sets its baseline; later scrapes report increases since the
previous one (see ``scrape.observe_delta``). Network errors become per-replica problems.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import httpx

from tabletune.daemon.observation import Observation, SourceResult
from tabletune.daemon.scrape import SampleHeads, Snapshot, observe_delta, parse_snapshot
from tabletune.daemon.settings import SourceSettings, mask_credentials
from tabletune.errors import InputError


class DirectSource:
    """Scrapes ``<replica>/metrics`` for a static list of replica base URLs."""

    def __init__(
        self,
        *,
        settings: SourceSettings,
        replicas: Sequence[str] | None = None,
        transport: httpx.BaseTransport | None = None,
        fetch: Callable[[str], str] | None = None,
    ) -> None:
        """``fetch(replica) -> /metrics text`` replaces HTTP (benchmarks on the emulator's
        core); it raises InputError when the replica cannot be read."""
        self._replicas = tuple(url.rstrip("/") for url in (replicas or settings.replicas))
        self._stale_after_s = settings.stale_after_s
        self._http = httpx.Client(timeout=settings.timeout_s, transport=transport)
        self._last: dict[str, tuple[float, Snapshot]] = {}
        self._fetch = fetch or self._http_text
        self._heads = SampleHeads()

    @property
    def replicas(self) -> tuple[str, ...]:
        return self._replicas

    def close(self) -> None:
        self._http.close()

    def has_baseline(self) -> bool:
        return all(replica in self._last for replica in self._replicas)

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
        """Scrape every replica; ``on_replica`` returning False abandons the rest (shutdown)."""
        observations: dict[str, Observation] = {}
        problems: dict[str, str] = {}
        for replica in self._replicas:
            if on_replica is not None and not on_replica():
                break
            try:
                snapshot = self._scrape(replica)
            except InputError as error:
                problems[replica] = str(error)
                continue
            previous = self._last.get(replica)
            self._last[replica] = (now, snapshot)
            if previous is None:
                continue  # baseline only
            then, before = previous
            if now - then > self._stale_after_s:
                problems[replica] = f"previous scrape is {now - then:.0f} s old; new baseline"
                continue
            observations[replica] = observe_delta(
                before,
                snapshot,
                replica=replica,
                admin_url=replica,
                interval_s=max(now - then, 1e-9),
            )
        return SourceResult(observations=observations, problems=problems)
