"""The Prometheus source against a real Prometheus scraping vLLM-shaped /metrics served by an
exporter the test controls: windows count exactly (equal to the traffic, not within a few
percent), and every fault the daemon may meet either counts exactly or refuses the window —
engine restarts (with and without a start time, down across a window), Prometheus restarted
empty or after an outage, a newly added target, Prometheus gone."""

from __future__ import annotations

import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tabletune.daemon.observation import Observation, SourceResult
from tabletune.daemon.prometheus_http import PrometheusHttp
from tabletune.daemon.prometheus_source import PrometheusSource
from tabletune.daemon.settings import SourceSettings, load_settings
from tabletune.errors import TemporaryError
from tests.integration.conftest import PrometheusFactory
from tests.support.servers import (
    PROMETHEUS_BINARY,
    PrometheusServer,
    TextServer,
    free_port,
    poll_until,
    prometheus_config,
    require_binary,
    running,
    terminate,
)
from tests.unit.test_daemon_scrape import FakeVllm

pytestmark = pytest.mark.integration

SCRAPE = "100ms"
GENERATED = "sum(vllm:generation_tokens_total)"


class Exporter:
    """One vLLM engine's /metrics on a fixed port. ``serve`` a new ``FakeVllm`` after ``stop``
    is a restart; ``created=False`` drops every ``_created`` sample (what vLLM's multi-process
    mode exposes: no start time at all, restarts show only as counters going back)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.target = f"127.0.0.1:{port}"
        self._server: TextServer | None = None

    def serve(self, vllm: FakeVllm, *, created: bool = True) -> None:
        def page(path: str) -> bytes:
            lines = vllm.text().splitlines()
            return "\n".join(x for x in lines if created or "_created" not in x).encode() + b"\n"

        self._server = TextServer(self.port, page)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


@pytest.fixture
def exporters() -> Iterator[Callable[[], Exporter]]:
    made: list[Exporter] = []

    def make() -> Exporter:
        made.append(Exporter(free_port()))
        return made[-1]

    yield make
    for exporter in made:
        exporter.stop()


def fresh_vllm(*, started: float | None = 1_000.0) -> FakeVllm:
    vllm = FakeVllm(started=started)
    vllm.traffic("0", drafts=0, batch=1, k=3, step_s=0.01)  # the engine's series exist, at zero
    return vllm


@dataclass
class OneEngine:
    engine: Exporter
    vllm: FakeVllm
    prom: PrometheusServer
    source: PrometheusSource


def one_engine(
    prometheus_factory: PrometheusFactory,
    exporters: Callable[[], Exporter],
    *,
    created: bool = True,
) -> OneEngine:
    """An engine (its series at zero) scraped every 100 ms, and a source whose first window
    starts now."""
    engine = exporters()
    vllm = fresh_vllm()
    engine.serve(vllm, created=created)
    prom = prometheus_factory([engine.target], scrape_interval=SCRAPE, scrape_timeout=SCRAPE)
    settle(prom, 0)
    return OneEngine(engine, vllm, prom, source_for(prom))


def source_for(prom: PrometheusServer, **env: str) -> PrometheusSource:
    settings = load_settings(
        {
            "TABLETUNE_SOURCE__PROMETHEUS_URL": prom.url,
            "TABLETUNE_SOURCE__QUERY_DELAY_S": "0",
            **{f"TABLETUNE_SOURCE__{k}": v for k, v in env.items()},
        }
    ).source
    return PrometheusSource(settings=settings, last_evaluation=time.time())


def settle(prom: PrometheusServer, expected: float, expr: str = GENERATED) -> None:
    """Prometheus has scraped ``expected`` and a few scrapes after it (flat window edge)."""
    prom.wait_for(lambda: prom.query_value(expr) == expected, what=f"{expr} == {expected}")
    time.sleep(0.35)


def traffic(vllm: FakeVllm, drafts: int) -> float:
    """``drafts`` requests at B=8, k=3; returns the engine's generated-token total after.

    It waits out a scrape first (longer than the 100 ms scrape timeout): Prometheus stamps a
    sample with the scrape's start, so a slow scrape that began before the last window edge
    could otherwise read traffic sent after it, and the count would land before the edge (seen
    once on a loaded machine; the daemon's default query delay of 5 s keeps it from serving)."""
    time.sleep(0.25)
    vllm.traffic("0", drafts=drafts, batch=8, k=3, step_s=0.01)
    return float(vllm.tokens.labels("0", "m")._value.get())


def observed(result: SourceResult, target: str) -> Observation:
    assert target in result.observations, result.problems
    return result.observations[target]


def assert_exact(obs: Observation, drafts: int) -> None:
    """The window holds exactly ``drafts`` requests at B=8, k=3 (acceptance 1/2, 1/4, 1/8)."""
    assert obs.drafted == (drafts, drafts, drafts)
    assert obs.accepted == (drafts / 2, drafts / 4, drafts / 8)
    assert obs.generated_tokens == drafts * 1.875
    steps = drafts // 8
    if steps:
        cell = obs.step_cells[(3, 8, 8)]
        assert (cell.steps, cell.requests, cell.tokens) == (steps, steps * 8, steps * 32)
        assert cell.seconds == pytest.approx(steps * 0.01, rel=1e-9)
        assert obs.mean_batch == 8.0
    else:
        assert obs.step_cells == {}


def test_windows_add_up_exactly_and_a_restart_counts_from_zero(
    prometheus_factory: PrometheusFactory, exporters: Callable[[], Exporter]
) -> None:
    rig = one_engine(prometheus_factory, exporters)
    engine, vllm, prom, source = rig.engine, rig.vllm, rig.prom, rig.source
    settle(prom, traffic(vllm, 1200))
    first = observed(source.collect(time.time()), engine.target)
    settle(prom, traffic(vllm, 2400))
    second = observed(source.collect(time.time()), engine.target)
    assert_exact(first, 1200)
    assert_exact(second, 2400)
    for obs in (first, second):
        assert obs.model_name == "m"
        assert obs.admin_url == f"http://{engine.target}"
        assert not obs.reset

    # The engine restarts on the same port: counters start from zero again.
    engine.stop()
    restarted = fresh_vllm(started=2_000.0)
    engine.serve(restarted)
    settle(prom, traffic(restarted, 800))
    third = observed(source.collect(time.time()), engine.target)
    assert third.reset
    assert_exact(third, 800)
    settle(prom, traffic(restarted, 400))
    fourth = observed(source.collect(time.time()), engine.target)
    assert not fourth.reset  # reported once, in the window that holds the restart
    assert_exact(fourth, 400)

    prom.process.terminate()
    prom.process.wait(timeout=10)
    with pytest.raises(TemporaryError, match="Prometheus query failed"):
        source.collect(time.time())


def wait_down(prom: PrometheusServer, target: str) -> None:
    prom.wait_for(lambda: prom.query_value(f'up{{instance="{target}"}}') == 0, what="target down")


@pytest.mark.parametrize(
    ("started", "created", "evidence"),
    [
        (2_000.0, True, "process start time"),
        (None, True, "_created"),
        (None, False, "a counter that went back"),
    ],
)
def test_an_engine_restart_with_downtime_across_a_window_is_counted_from_zero(
    prometheus_factory: PrometheusFactory,
    exporters: Callable[[], Exporter],
    started: float | None,
    created: bool,
    evidence: str,
) -> None:
    rig = one_engine(prometheus_factory, exporters, created=created)
    engine, vllm, prom, source = rig.engine, rig.vllm, rig.prom, rig.source
    settle(prom, traffic(vllm, 2400))
    assert_exact(observed(source.collect(time.time()), engine.target), 2400)
    engine.stop()
    wait_down(prom, engine.target)
    source.collect(time.time())  # the window of the stop: counted up to its last answer
    time.sleep(0.5)
    down = source.collect(time.time())  # a whole window while the engine is down
    assert "down" in down.problems[engine.target], evidence
    restarted = fresh_vllm(started=started)
    engine.serve(restarted, created=created)
    settle(prom, traffic(restarted, 800))
    back = observed(source.collect(time.time()), engine.target)
    assert back.reset, evidence
    assert_exact(back, 800)
    settle(prom, traffic(restarted, 160))
    after = observed(source.collect(time.time()), engine.target)
    assert not after.reset
    assert_exact(after, 160)


def test_an_engine_down_longer_than_the_lookback_counts_only_with_a_start_time(
    prometheus_factory: PrometheusFactory, exporters: Callable[[], Exporter]
) -> None:
    with_start, counters_only = exporters(), exporters()
    engines = {with_start: 1_000.0, counters_only: None}
    vllms = {e: fresh_vllm(started=s) for e, s in engines.items()}
    for e, vllm in vllms.items():
        e.serve(vllm, created=e is with_start)
    targets = [e.target for e in engines]
    prom = prometheus_factory(targets, scrape_interval=SCRAPE, scrape_timeout=SCRAPE)
    settle(prom, 0)
    source = source_for(prom, STALE_AFTER_S="1")  # the query reaches 1 s before a window

    def window(drafts: int, generated_since_start: int) -> SourceResult:
        for vllm in vllms.values():
            traffic(vllm, drafts)
        settle(prom, 2 * generated_since_start * 1.875)
        return source.collect(time.time())

    first = window(2400, 2400)
    for e in engines:
        assert_exact(observed(first, e.target), 2400)
        e.stop()
        wait_down(prom, e.target)
    time.sleep(1.5)
    source.collect(time.time())  # the down window
    time.sleep(1.0)
    vllms = {e: fresh_vllm(started=None if s is None else time.time()) for e, s in engines.items()}
    for e, vllm in vllms.items():
        e.serve(vllm, created=e is with_start)
    back = window(800, 800)
    # The last successful scrape before the window is out of reach: the engine exporting its
    # start time (after the window start) is counted from zero; the other is refused.
    assert observed(back, with_start.target).reset
    assert_exact(observed(back, with_start.target), 800)
    assert "unknown" in back.problems[counters_only.target]
    again = window(160, 960)
    for e in engines:
        assert_exact(observed(again, e.target), 160)


def restart_prometheus(
    prom: PrometheusServer, *, empty: bool, log: str
) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """The same Prometheus (port, config) again, on its data or on an empty database."""
    command = [str(arg) for arg in prom.process.args]  # type: ignore[union-attr]
    if empty:
        fresh = prom.data_dir.with_name("data-empty")
        command = [
            f"--storage.tsdb.path={fresh}" if a.startswith("--storage.tsdb.path=") else a
            for a in command
        ]
    return running(command, ready_url=f"{prom.url}/-/ready", log_path=prom.log_path.with_name(log))


@pytest.mark.parametrize("empty", [True, False], ids=["empty database", "same database"])
def test_prometheus_restarted_refuses_or_counts_exactly(
    prometheus_factory: PrometheusFactory, exporters: Callable[[], Exporter], empty: bool
) -> None:
    rig = one_engine(prometheus_factory, exporters)
    engine, vllm, prom, source = rig.engine, rig.vllm, rig.prom, rig.source
    settle(prom, traffic(vllm, 1200))
    assert_exact(observed(source.collect(time.time()), engine.target), 1200)
    prom.process.terminate()
    prom.process.wait(timeout=10)
    traffic(vllm, 2400)  # served while Prometheus is down
    with pytest.raises(TemporaryError):
        source.collect(time.time())
    time.sleep(1.0)
    with restart_prometheus(prom, empty=empty, log="restarted.log"):
        prom.wait_for_targets_up()
        settle(prom, float(vllm.tokens.labels("0", "m")._value.get()))
        result = source.collect(time.time())
        if empty:
            # no sample before the window: refused, never counted since the engine started
            assert engine.target not in result.observations
            assert "before the window start" in result.problems[engine.target]
        else:
            # the window runs from the last evaluation before the outage: exact, gap included
            assert_exact(observed(result, engine.target), 2400)
        settle(prom, traffic(vllm, 400))
        assert_exact(observed(source.collect(time.time()), engine.target), 400)


def test_a_newly_added_target_is_refused_once_then_counted_from_its_first_window(
    prometheus_factory: PrometheusFactory, exporters: Callable[[], Exporter]
) -> None:
    old, new = exporters(), exporters()
    old_vllm, new_vllm = fresh_vllm(), fresh_vllm()
    old.serve(old_vllm)
    new.serve(new_vllm)
    traffic(new_vllm, 8000)  # a long-running engine Prometheus has never scraped
    prom = prometheus_factory([old.target], scrape_interval=SCRAPE, scrape_timeout=SCRAPE)
    settle(prom, 0)
    source = source_for(prom)
    config = yaml.safe_load(prom.config_path.read_text())
    config["scrape_configs"][0]["static_configs"][0]["targets"].append(new.target)
    prom.config_path.write_text(yaml.safe_dump(config))
    prom.reload()
    prom.wait_for_targets_up(count=2)
    traffic(old_vllm, 400)
    settle(prom, (8000 + 400) * 1.875)
    first = source.collect(time.time())
    assert_exact(observed(first, old.target), 400)
    assert new.target not in first.observations
    assert "before the window start" in first.problems[new.target]
    traffic(old_vllm, 240)
    traffic(new_vllm, 320)
    settle(prom, (8000 + 400 + 240 + 320) * 1.875)
    second = source.collect(time.time())
    assert_exact(observed(second, old.target), 240)
    assert_exact(observed(second, new.target), 320)


# bcrypt of "s3cret" (cost 4, fast to check) for Prometheus's web config
PASSWORD = "s3cret"
PASSWORD_HASH = "$2b$04$IrCPvZ.4tsuwkknmXhfwVuGFhuvvvkjrUzH2bZ.EDBf5iQVUcRgW2"


@contextmanager
def secured_prometheus(workdir: Path, target: str) -> Iterator[tuple[str, Path]]:
    """A real Prometheus serving HTTPS (a self-signed certificate made with openssl) behind
    basic auth (user ``ops``); yields its URL and the certificate (its own CA)."""
    binary = require_binary(PROMETHEUS_BINARY)
    openssl = require_binary("openssl")
    port = free_port()
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    web = {
        "tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
        "basic_auth_users": {"ops": PASSWORD_HASH},
    }
    (workdir / "web.yml").write_text(yaml.safe_dump(web))
    config = prometheus_config([target], scrape_interval=SCRAPE, scrape_timeout=SCRAPE)
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"https://127.0.0.1:{port}"
    with (workdir / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            [binary, f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             f"--web.config.file={workdir / 'web.yml'}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            ready = ssl.create_default_context(cafile=str(cert))

            def answers() -> bool:
                assert process.poll() is None, "Prometheus exited"
                try:
                    response = httpx.get(f"{url}/-/ready", verify=ready, auth=("ops", PASSWORD))
                except httpx.HTTPError:
                    return False
                return response.status_code == 200

            poll_until(answers, timeout_s=30, what="secured Prometheus ready")
            yield url, cert
        finally:
            terminate(process)


def test_prometheus_over_tls_with_basic_auth(
    tmp_path: Path, exporters: Callable[[], Exporter]
) -> None:
    engine = exporters()
    vllm = fresh_vllm()
    engine.serve(vllm)
    with secured_prometheus(tmp_path, engine.target) as (url, cert):

        def settings(**env: str) -> SourceSettings:
            values = {"PROMETHEUS_URL": url, "QUERY_DELAY_S": "0", **env}
            return load_settings({f"TABLETUNE_SOURCE__{k}": v for k, v in values.items()}).source

        good = settings(
            PROMETHEUS_USERNAME="ops", PROMETHEUS_PASSWORD=PASSWORD, PROMETHEUS_CA_FILE=str(cert)
        )
        client = PrometheusHttp(good)
        poll_until(lambda: client.custom_query("up == 1"), timeout_s=20, what="a scrape")
        time.sleep(0.35)
        source = PrometheusSource(settings=good, api=client, last_evaluation=time.time())
        expected = traffic(vllm, 800)

        def landed() -> bool:
            rows = client.custom_query(GENERATED)
            return bool(rows) and float(rows[0]["value"][1]) == expected

        poll_until(landed, timeout_s=20, what="traffic in Prometheus")
        time.sleep(0.35)
        assert_exact(observed(source.collect(time.time()), engine.target), 800)

        in_url = settings(
            PROMETHEUS_URL=url.replace("https://", f"https://ops:{PASSWORD}@"),
            PROMETHEUS_CA_FILE=str(cert),
        )
        assert PrometheusHttp(in_url).custom_query("up == 1")
        failures = {
            "HTTP 401": settings(
                PROMETHEUS_USERNAME="ops",
                PROMETHEUS_PASSWORD="wrong-" + PASSWORD,
                PROMETHEUS_CA_FILE=str(cert),
            ),
            "CERTIFICATE_VERIFY_FAILED": settings(  # verified by default: self-signed refused
                PROMETHEUS_USERNAME="ops", PROMETHEUS_PASSWORD=PASSWORD
            ),
        }
        for message, bad in failures.items():
            with pytest.raises(TemporaryError, match=message) as raised:
                PrometheusSource(settings=bad).collect(time.time())
            assert PASSWORD not in str(raised.value)
