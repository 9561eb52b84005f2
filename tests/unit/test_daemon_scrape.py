"""Direct-scrape parsing (pure) and the direct source against a real HTTP /metrics server."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import start_http_server
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tabletune import metric_names as mn
from tabletune.daemon.counters import CELL_FIELDS, DRAFTED, GENERATED
from tabletune.daemon.direct_source import DirectSource
from tabletune.daemon.replica_io import ReplicaIo
from tabletune.daemon.scrape import SampleHeads, Snapshot, observe_delta, parse_snapshot
from tabletune.daemon.settings import load_settings
from tabletune.errors import InputError
from tabletune.plugin.step_metrics import EngineSteps, step_cell_families
from tabletune.step_cells import CellTotals, StepCellCounter
from tests.support.servers import free_port, poll_until


class FakeVllm:
    """vLLM + plugin series as prometheus_client writes them (vLLM's counters and the plugin's
    step cells per engine); ``started`` is the process start time it exports, if any."""

    def __init__(self, *, started: float | None = 1_000.0, model: str = "m") -> None:
        self.registry = CollectorRegistry()
        self.model = model
        self.started = started
        self.cells: dict[str, StepCellCounter] = {}
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
        self.running = Gauge(mn.VLLM_NUM_REQUESTS_RUNNING, "r", labels, registry=r)
        r.register(_Plugin(self))

    def engine(self, engine: str) -> StepCellCounter:
        """The engine's step cells; its vLLM counters exist (at zero) from then on."""
        self.tokens.labels(engine, self.model)
        return self.cells.setdefault(engine, StepCellCounter())

    def traffic(self, engine: str, *, drafts: int, batch: int, k: int, step_s: float) -> None:
        """``drafts`` requests drafting k with acceptance 0.5, 0.25, ... in steps of ``batch``."""
        cells = self.engine(engine)
        self.drafts.labels(engine, self.model).inc(drafts)
        kept = 0.0
        for position in range(k):
            self.drafted.labels(engine, self.model, str(position)).inc(drafts)
            accepted = drafts / 2 ** (position + 1)
            self.accepted.labels(engine, self.model, str(position)).inc(accepted)
            kept += accepted
        self.tokens.labels(engine, self.model).inc(drafts + kept)
        for _ in range(drafts // batch):
            cells.record(batch_size=batch, k=k, duration_s=step_s, tokens=batch * (k + 1))
        self.running.labels(engine, self.model).set(batch)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


class _Plugin(Collector):
    """The plugin's step-cell families, and vLLM's process start time."""

    def __init__(self, vllm: FakeVllm) -> None:
        self.vllm = vllm

    def collect(self) -> Iterator[Metric]:
        created = self.vllm.started or 1_000.0
        yield from step_cell_families(
            EngineSteps((self.vllm.model, engine), c.totals(), c.steps_without_decode, created)
            for engine, c in sorted(self.vllm.cells.items())
        )
        if self.vllm.started is not None:
            yield GaugeMetricFamily("process_start_time_seconds", "s", value=self.vllm.started)


def test_parse_keeps_engines_apart_and_reads_every_family() -> None:
    vllm = FakeVllm()
    vllm.traffic("0", drafts=800, batch=8, k=3, step_s=0.01)
    vllm.traffic("1", drafts=800, batch=8, k=3, step_s=0.01)
    snap = parse_snapshot(vllm.text())
    assert snap.totals[(DRAFTED, "1", "2", "", "")] == 800.0
    assert snap.totals[(GENERATED, "0", "", "", "")] == 800.0 + 400 + 200 + 100
    steps = next(name for name, field in CELL_FIELDS.items() if field == "steps")
    assert snap.totals[(steps, "0", "", "3", "8")] == 100.0
    assert snap.starts[("process_start_time_seconds", "", "", "", "")] == 1_000.0
    assert snap.running == 16.0
    assert snap.model_name == "m"


def test_delta_between_scrapes() -> None:
    vllm = FakeVllm()
    vllm.traffic("0", drafts=400, batch=4, k=2, step_s=0.01)
    before = parse_snapshot(vllm.text())
    vllm.traffic("0", drafts=1000, batch=20, k=3, step_s=0.02)
    vllm.traffic("1", drafts=600, batch=20, k=3, step_s=0.04)
    vllm.engine("1").record_without_decode()
    obs = observe_delta(
        before, parse_snapshot(vllm.text()), replica="r", admin_url="http://r", interval_s=10
    )
    assert not obs.reset
    assert obs.drafted == (1600.0, 1600.0, 1600.0)
    assert obs.accepted == (800.0, 400.0, 200.0)
    assert obs.generated_tokens == 1600 * 1.875
    # engines summed cell by cell: 50 + 30 steps at B=20, in the 17-24 cell
    assert obs.step_cells == {
        (3, 17, 24): CellTotals(
            steps=80.0,
            seconds=pytest.approx(2.2),
            seconds_sq=pytest.approx(50 * 0.02**2 + 30 * 0.04**2),
            tokens=80.0 * 80,
            requests=1600.0,
        )
    }
    assert obs.mean_batch == 20.0
    assert obs.steps_without_decode == 1.0
    assert obs.tokens_per_s == 300.0


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
    cell = obs.step_cells[(1, 4, 4)]
    assert (cell.steps, cell.tokens, cell.requests) == (75.0, 600.0, 300.0)
    assert cell.seconds == pytest.approx(0.75)


def test_a_new_start_time_is_a_restart_even_when_counters_climbed_past_their_old_values() -> None:
    vllm = FakeVllm(started=1_000.0)
    vllm.traffic("0", drafts=100, batch=4, k=1, step_s=0.01)
    before = parse_snapshot(vllm.text())
    restarted = FakeVllm(started=2_000.0)
    restarted.traffic("0", drafts=400, batch=4, k=1, step_s=0.01)
    obs = observe_delta(
        before, parse_snapshot(restarted.text()), replica="r", admin_url="r", interval_s=5
    )
    assert obs.reset
    assert obs.drafted == (400.0,)


def test_a_series_gone_is_a_restart() -> None:
    vllm = FakeVllm(started=None)
    vllm.traffic("0", drafts=100, batch=4, k=1, step_s=0.01)
    vllm.traffic("0", drafts=100, batch=30, k=1, step_s=0.01)
    before = parse_snapshot(vllm.text())
    restarted = FakeVllm(started=None)  # only the B=4 cell exists again, and grew past before
    restarted.traffic("0", drafts=400, batch=4, k=1, step_s=0.01)
    restarted.tokens.labels("0", "m").inc(1_000)
    # no start time at all (prometheus_client's own _created lines dropped): only the cell gone
    text = "\n".join(line for line in restarted.text().splitlines() if "_created" not in line)
    obs = observe_delta(before, parse_snapshot(text), replica="r", admin_url="r", interval_s=5)
    assert obs.reset
    assert obs.step_cells[(1, 4, 4)].steps == 100.0


def test_no_step_cells_uses_the_running_gauge() -> None:
    text = f'{mn.VLLM_NUM_REQUESTS_RUNNING}{{engine="0",model_name="m"}} 7\n'
    obs = observe_delta(Snapshot(), parse_snapshot(text), replica="r", admin_url="r", interval_s=1)
    assert obs.mean_batch == 7.0
    assert obs.drafted == ()
    assert obs.step_cells == {}


def test_garbled_text_is_an_input_error() -> None:
    with pytest.raises(InputError):
        parse_snapshot('vllm:generation_tokens_total{engine="0" 1\n')


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
    # Each read is stamped with when its answer came: the first took the dead one's refusal.
    assert obs.interval_s == pytest.approx(15.0, abs=1.0)
    assert obs.drafted == (400.0, 400.0, 400.0)
    assert obs.step_cells[(3, 4, 4)].steps == 100.0
    assert obs.admin_url == url
    # A gap longer than the staleness limit starts a new baseline instead of a giant delta.
    third = source.collect(115.0 + 10_000)
    assert url in third.problems and url not in third.observations
    source.close()


def test_direct_source_errors_hide_url_credentials() -> None:
    settings = load_settings({"TABLETUNE_SOURCE__TIMEOUT_S": "1"}).source
    url = f"http://ops:s3cret@127.0.0.1:{free_port()}"
    source = DirectSource(settings=settings, replicas=[url])
    problem = source.collect(0.0).problems[url]
    assert "s3cret" not in problem and "ops:***@" in problem
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
        'vllm_generation_tokens_total{engine="0",model_name="m"} 42 1700000000000\n'
        'vllm_spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 21\n'
        'vllm_generation_tokens_created{engine="0",model_name="m"} 1700000000\n'
        "# EOF\n"
    )
    snap = parse_snapshot(text, heads=SampleHeads())
    assert snap.totals[(GENERATED, "0", "", "", "")] == 42.0
    assert snap.totals[(f"{mn.VLLM_ACCEPTED_PER_POS}_total", "0", "0", "", "")] == 21.0
    assert snap.starts == {(f"{mn.VLLM_GENERATION_TOKENS}_created", "0", "", "", ""): 1.7e9}


def test_a_hung_replica_is_its_own_problem_and_those_left_in_line_go_first_next() -> None:
    vllm = FakeVllm()
    vllm.traffic("0", drafts=100, batch=4, k=3, step_s=0.01)
    release = threading.Event()
    asked: list[str] = []

    def fetch(replica: str) -> str:
        asked.append(replica)
        if replica == "a":
            release.wait()
        return vllm.text()

    ticks = iter(range(10**6))
    io = ReplicaIo(workers=1, monotonic=lambda: float(next(ticks)))
    settings = load_settings({}).source
    source = DirectSource(
        settings=settings, replicas=["a", "b", "c"], fetch=fetch, io=io, budget_s=20.0
    )
    try:
        first = source.collect(0.0)
        # "a" hangs on the only worker: it is late; "b" and "c" were never asked.
        assert list(first.problems) == ["a"] and "no answer" in first.problems["a"]
        assert asked == ["a"]
        release.set()
        poll_until(lambda: not io.busy("scrape", "a"), timeout_s=10, what="a's scrape ended")
        second = source.collect(15.0)
        assert asked == ["a", "b", "c", "a"]  # the ones left out went first
        assert second.problems == {}
    finally:
        release.set()
