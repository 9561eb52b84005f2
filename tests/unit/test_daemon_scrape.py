"""Direct-scrape parsing (pure) and the direct source against a real HTTP /metrics server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import start_http_server

from tabletune import metric_names as mn
from tabletune.daemon.direct_source import DirectSource
from tabletune.daemon.scrape import (
    SampleHeads,
    Snapshot,
    buckets_to_ranges,
    observe_delta,
    parse_snapshot,
)
from tabletune.daemon.settings import load_settings
from tabletune.errors import InputError
from tests.support.servers import free_port


class FakeVllm:
    """vLLM + plugin series as prometheus_client writes them (two data-parallel engines)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        labels = [mn.LABEL_ENGINE, mn.LABEL_MODEL]
        self.drafts = Counter(mn.VLLM_NUM_DRAFTS, "d", labels, registry=r)
        self.tokens = Counter(mn.VLLM_GENERATION_TOKENS, "t", labels, registry=r)
        self.accepted = Counter(
            mn.VLLM_ACCEPTED_PER_POS, "a", [*labels, mn.LABEL_POSITION], registry=r
        )
        self.drafted = Counter(
            mn.TT_DRAFT_TOKENS_PER_POS, "p", [*labels, mn.LABEL_POSITION], registry=r
        )
        self.batch = Histogram(
            mn.TT_DECODE_BATCH_SIZE, "b", labels, buckets=mn.BATCH_SIZE_BUCKETS, registry=r
        )
        self.steps = Histogram(
            mn.TT_STEP_DURATION, "s", [mn.LABEL_K, mn.LABEL_BATCH_BUCKET], registry=r
        )
        self.running = Gauge(mn.VLLM_NUM_REQUESTS_RUNNING, "r", labels, registry=r)

    def traffic(self, engine: str, *, drafts: int, batch: int, k: int, step_s: float) -> None:
        """``drafts`` requests drafting k with acceptance 0.5, 0.25, ... in steps of ``batch``."""
        self.drafts.labels(engine, "m").inc(drafts)
        kept = 0.0
        for position in range(k):
            self.drafted.labels(engine, "m", str(position)).inc(drafts)
            accepted = drafts / 2 ** (position + 1)
            self.accepted.labels(engine, "m", str(position)).inc(accepted)
            kept += accepted
        self.tokens.labels(engine, "m").inc(drafts + kept)
        for _ in range(drafts // batch):
            self.batch.labels(engine, "m").observe(batch)
            self.steps.labels(str(k), mn.batch_bucket(batch)).observe(step_s)
        self.running.labels(engine, "m").set(batch)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_parse_sums_engines_and_reads_every_series() -> None:
    vllm = FakeVllm()
    vllm.traffic("0", drafts=800, batch=8, k=3, step_s=0.01)
    vllm.traffic("1", drafts=800, batch=8, k=3, step_s=0.01)
    snap = parse_snapshot(vllm.text())
    assert snap.drafted == {0: 1600.0, 1: 1600.0, 2: 1600.0}
    assert snap.accepted == {0: 800.0, 1: 400.0, 2: 200.0}
    assert snap.drafts == 1600.0
    assert snap.batch_count == 200.0 and snap.batch_sum == 1600.0
    assert snap.step_count == {(3, "8-15"): 200.0}
    assert snap.step_sum[(3, "8-15")] == pytest.approx(2.0)
    assert snap.running == 16.0
    assert snap.model_name == "m"


def test_delta_between_scrapes() -> None:
    vllm = FakeVllm()
    vllm.traffic("0", drafts=400, batch=4, k=2, step_s=0.01)
    before = parse_snapshot(vllm.text())
    vllm.traffic("0", drafts=1000, batch=10, k=3, step_s=0.02)
    obs = observe_delta(
        before, parse_snapshot(vllm.text()), replica="r", admin_url="http://r", interval_s=10
    )
    assert not obs.reset
    assert obs.drafted == (1000.0, 1000.0, 1000.0)
    assert obs.accepted == (500.0, 250.0, 125.0)
    assert obs.load_buckets == {(9, 16): 100.0}
    assert obs.mean_batch == 10.0
    assert obs.generated_tokens == 1875.0
    assert obs.step_times == {(3, "8-15"): (pytest.approx(2.0), 100.0)}
    assert obs.tokens_per_s == 187.5


def test_counter_reset_counts_from_zero() -> None:
    vllm = FakeVllm()
    vllm.traffic("0", drafts=5000, batch=8, k=3, step_s=0.01)
    before = parse_snapshot(vllm.text())
    restarted = FakeVllm()  # a new process: counters start again at zero
    restarted.traffic("0", drafts=300, batch=4, k=1, step_s=0.01)
    obs = observe_delta(
        before, parse_snapshot(restarted.text()), replica="r", admin_url="r", interval_s=5
    )
    assert obs.reset
    assert obs.drafted == (300.0,)
    assert obs.accepted == (150.0,)
    assert obs.generated_tokens == 450.0


def test_no_traffic_no_histogram_uses_running_gauge() -> None:
    text = f'{mn.VLLM_NUM_REQUESTS_RUNNING}{{engine="0",model_name="m"}} 7\n'
    obs = observe_delta(Snapshot(), parse_snapshot(text), replica="r", admin_url="r", interval_s=1)
    assert obs.mean_batch == 7.0
    assert obs.drafted == ()


def test_garbled_text_is_an_input_error() -> None:
    with pytest.raises(InputError):
        parse_snapshot('vllm:spec_decode_num_drafts_total{engine="0" 1\n')


def test_buckets_to_ranges() -> None:
    assert buckets_to_ranges({1.0: 2, 2.0: 2, 4.0: 5, 8.0: 5, float("inf"): 6}) == {
        (1, 1): 2,
        (3, 4): 3,
        (9, 9): 1,
    }


@pytest.fixture
def served() -> Iterator[tuple[FakeVllm, str]]:
    vllm = FakeVllm()
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=vllm.registry)
    try:
        yield vllm, f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_direct_source_baseline_then_deltas(served: tuple[FakeVllm, str]) -> None:
    vllm, url = served
    dead = f"http://127.0.0.1:{free_port()}"
    settings = load_settings({"TABLETUNE_SOURCE__TIMEOUT_S": "2"}).source
    source = DirectSource(settings=settings, replicas=[url, dead])
    vllm.traffic("0", drafts=100, batch=4, k=3, step_s=0.01)
    first = source.collect(100.0)
    assert first.observations == {}  # baseline only
    assert dead in first.problems and "ConnectError" in first.problems[dead]
    vllm.traffic("0", drafts=400, batch=4, k=3, step_s=0.01)
    second = source.collect(115.0)
    obs = second.observations[url]
    assert obs.interval_s == 15.0
    assert obs.drafted == (400.0, 400.0, 400.0)
    assert obs.admin_url == url
    # A gap longer than the staleness limit starts a new baseline instead of a giant delta.
    third = source.collect(115.0 + 10_000)
    assert url in third.problems and url not in third.observations
    source.close()


def test_memoised_heads_parse_like_the_parser() -> None:
    vllm = FakeVllm()
    vllm.traffic("0", drafts=700, batch=8, k=3, step_s=0.01)
    text = vllm.text()
    heads = SampleHeads()
    assert parse_snapshot(text, heads=heads) == parse_snapshot(text)
    vllm.traffic("0", drafts=300, batch=8, k=3, step_s=0.01)
    again = vllm.text()
    assert parse_snapshot(again, heads=heads) == parse_snapshot(again)  # cached heads, new values


def test_timestamps_and_openmetrics_names_are_read() -> None:
    text = (
        'vllm_spec_decode_num_drafts_total{engine="0",model_name="m"} 42 1700000000000\n'
        'vllm_spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 21\n'
        "# EOF\n"
    )
    snap = parse_snapshot(text, heads=SampleHeads())
    assert snap.drafts == 42.0
    assert snap.accepted == {0: 21.0}
