"""The Prometheus source against a real Prometheus scraping vLLM-shaped /metrics: adjacent
increase() windows add up to the traffic, a restart is seen as a reset, an outage is an error."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from prometheus_client.exposition import start_http_server

from tabletune.daemon.prometheus_source import PrometheusSource, series
from tabletune.daemon.settings import load_settings
from tabletune.errors import TemporaryError
from tests.integration.conftest import PrometheusFactory
from tests.support.servers import free_port
from tests.unit.test_daemon_scrape import FakeVllm


@contextmanager
def serve(vllm: FakeVllm, port: int) -> Iterator[None]:
    server, thread = start_http_server(port, addr="127.0.0.1", registry=vllm.registry)
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def fresh_vllm() -> FakeVllm:
    vllm = FakeVllm()
    vllm.traffic("0", drafts=0, batch=1, k=3, step_s=0.01)  # every series exists, at zero
    return vllm


@pytest.mark.integration
def test_windows_add_up_reset_and_outage(prometheus_factory: PrometheusFactory) -> None:
    port = free_port()
    target = f"127.0.0.1:{port}"
    vllm = fresh_vllm()
    with serve(vllm, port):
        prom = prometheus_factory([target], scrape_interval="100ms", scrape_timeout="100ms")
        prom.wait_for_targets_up()
        drafts = f"sum({series('vllm:spec_decode_num_drafts_total')})"
        prom.wait_for(lambda: prom.query_value(drafts) == 0, what="zero counters")
        settings = load_settings(
            {"TABLETUNE_SOURCE__PROMETHEUS_URL": prom.url, "TABLETUNE_SOURCE__QUERY_DELAY_S": "0"}
        ).source
        start = time.time()
        source = PrometheusSource(settings=settings, last_evaluation=start)
        prom.wait_for(lambda: prom.query_value(drafts, at=time.time()) == 0, what="a flat start")
        vllm.traffic("0", drafts=1200, batch=8, k=3, step_s=0.01)
        prom.wait_for(lambda: prom.query_value(drafts) == 1200, what="first traffic")
        time.sleep(1.0)  # a few flat scrapes so the window edge falls where nothing changes
        first = source.collect(time.time())
        vllm.traffic("0", drafts=2400, batch=8, k=3, step_s=0.01)
        prom.wait_for(lambda: prom.query_value(drafts) == 3600, what="second traffic")
        time.sleep(1.0)
        second = source.collect(time.time())
    obs1, obs2 = first.observations[target], second.observations[target]
    # increase() extrapolates to the window edges (windows must span many scrapes): within
    # a few percent, never counted twice; ratios (acceptance, mean batch) are exact.
    assert obs1.drafted[0] + obs2.drafted[0] == pytest.approx(3600, rel=1e-9)
    assert obs2.drafted[0] == pytest.approx(2400, rel=1e-9)
    for obs in (obs1, obs2):
        rates = [a / d for a, d in zip(obs.accepted, obs.drafted, strict=True)]
        assert rates == pytest.approx([0.5, 0.25, 0.125], rel=1e-6)
        assert obs.mean_batch == pytest.approx(8.0)
        assert obs.model_name == "m"
        assert obs.admin_url == f"http://{target}"
        assert not obs.reset
    assert obs2.step_times[(3, "8-15")][1] == pytest.approx(300, rel=1e-9)

    # The engine restarts on the same port: counters start from zero again.
    restarted = fresh_vllm()
    with serve(restarted, port):
        prom.wait_for(lambda: prom.query_value(drafts) == 0, what="restart seen")
        restarted.traffic("0", drafts=800, batch=8, k=3, step_s=0.01)
        prom.wait_for(lambda: prom.query_value(drafts) == 800, what="traffic after restart")
        time.sleep(1.0)
        third = source.collect(time.time())
    obs3 = third.observations[target]
    assert obs3.reset
    assert obs3.drafted[0] == pytest.approx(800, rel=1e-9)

    prom.process.terminate()
    prom.process.wait(timeout=10)
    with pytest.raises(TemporaryError, match="Prometheus query failed"):
        source.collect(time.time())
