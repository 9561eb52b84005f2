"""Launch mode: the command and environment vLLM gets, start failures with the log tail, and the
server always stopped (the fake engine module stands in for vLLM's api_server)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from tabletune.profiler.engine import EngineHttp
from tabletune.profiler.errors import EngineStartError
from tabletune.profiler.hook_protocol import SamplerMode
from tabletune.profiler.progress import QuietReporter
from tabletune.profiler.records import RawRecord
from tabletune.profiler.run import ProfileRequest, ProfileRun
from tabletune.profiler.server import (
    EngineSpec,
    build_command,
    server_env,
    speculative_config,
    starting_table,
)
from tabletune.profiler.settings import (
    AcceptanceSettings,
    GridSettings,
    LaunchSettings,
    ProfilerSettings,
    TimingSettings,
)
from tabletune.schemas import load_acceptance, load_profile

REPO = Path(__file__).resolve().parents[2]
FAKE_MODULE = "tests.unit.test_profiler_fake_engine"


def test_starting_table_holds_every_k_once() -> None:
    assert starting_table((0, 1, 2, 3), 256) == ((1, 1, 3), (2, 2, 2), (3, 3, 1), (4, 256, 0))
    assert starting_table((3,), 8) == ((1, 8, 3),)


def test_command_and_speculative_config() -> None:
    spec = EngineSpec(
        model="/m/qwen3-4b",
        max_num_seqs=256,
        drafter="/m/eagle3",
        method="eagle3",
        num_speculative_tokens=3,
        starting_table=starting_table((0, 1, 2, 3), 256),
        sampler=SamplerMode.rejecting_all(3),
    )
    settings = LaunchSettings(python="py", extra_args=("--load-format", "dummy"))
    command = build_command(spec, settings=settings, port=8123)
    assert command[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert command[-2:] == ["--load-format", "dummy"]
    assert command[command.index("--port") + 1] == "8123"
    config = json.loads(command[command.index("--speculative-config") + 1])
    assert config == {
        "num_speculative_tokens": 3,
        "method": "eagle3",
        "model": "/m/eagle3",
        "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 2, 2], [3, 3, 1], [4, 256, 0]],
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": [0.0, 0.0, 0.0],
    }
    no_spec = EngineSpec(model="/m/qwen3-4b", max_num_seqs=8)
    assert speculative_config(no_spec) is None
    assert "--speculative-config" not in build_command(no_spec, settings=settings, port=1)


def test_server_env_names_every_plugin_and_dev_mode_but_keeps_the_users_choice() -> None:
    env = server_env(LaunchSettings(env=(("X", "1"),)), {"PATH": "/bin"})
    assert env["VLLM_PLUGINS"] == (
        "tabletune_engine,tabletune_http,tabletune_metrics,tabletune_profiler"
    )
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["X"] == "1" and env["PATH"] == "/bin"
    mine = server_env(LaunchSettings(), {"VLLM_PLUGINS": "tabletune_engine"})
    assert mine["VLLM_PLUGINS"] == "tabletune_engine"


def settings(**launch: object) -> ProfilerSettings:
    env = (("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])),)
    return ProfilerSettings(
        grid=GridSettings(dense_until=2, step=2),  # 1, 2, 4
        timing=TimingSettings(method="request", warmup_batches=(1,), repeats=1, decode_tokens=4),
        acceptance=AcceptanceSettings(
            num_prompts=8, max_tokens=9, concurrency=4, synthetic_rates=(0.5, 0.25)
        ),
        launch=LaunchSettings(
            **{  # type: ignore[arg-type]
                "server_module": FAKE_MODULE,
                "startup_timeout_s": 60,
                "stop_timeout_s": 10,
                "env": env,
                "extra_args": ("--fake-step-ms", "20"),
                **launch,
            }
        ),
    )


def request(tmp_path: Path) -> ProfileRequest:
    return ProfileRequest(
        output=tmp_path / "p.json",
        model="/models/fake",
        drafter="/models/fake-eagle",
        num_speculative_tokens=2,
        max_num_seqs=4,
        gpu="FAKE",
        model_runner="v2",
    )


def port_is_closed(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as sock:
        return sock.connect_ex((host, int(port))) != 0


def test_one_launch_profiles_and_the_server_is_stopped(tmp_path: Path) -> None:
    urls: list[str] = []

    def factory(url: str) -> EngineHttp:
        urls.append(url)
        return EngineHttp(url, settings=settings().connection)

    run = ProfileRun(
        request(tmp_path), settings=settings(), reporter=QuietReporter(), engine_factory=factory
    )
    run.run()
    profile = load_profile(run.paths.profile)
    assert profile.ks == (0, 1, 2)
    assert profile.batch_grid == (1, 2, 4)
    assert {"engine_start", "timing", "acceptance"} <= set(profile.metadata.wall_time_s)
    assert "engine_restarts" not in profile.metadata.wall_time_s  # one launch did everything
    assert load_acceptance(run.paths.acceptance).rates == pytest.approx((0.5, 0.25))
    assert len(list(run.paths.logs.glob("vllm-*.log"))) == 1
    assert urls and port_is_closed(urls[0])


def test_without_the_hook_each_sampler_gets_its_own_launch(tmp_path: Path) -> None:
    no_hook = settings(extra_args=("--fake-step-ms", "20", "--fake-no-hook"))
    reporter = QuietReporter()
    run = ProfileRun(request(tmp_path), settings=no_hook, reporter=reporter)
    run.run()
    profile = load_profile(run.paths.profile)
    assert "engine_restarts" in profile.metadata.wall_time_s
    assert "sampler switch unavailable" in profile.metadata.notes
    logs = sorted(run.paths.logs.glob("vllm-*.log"))
    assert len(logs) == 3  # serving (unused), timing mode, acceptance's synthetic rates
    assert load_acceptance(run.paths.acceptance).rates == pytest.approx((0.5, 0.25))


def test_a_vllm_that_exits_at_start_fails_with_its_log_tail(tmp_path: Path) -> None:
    run = ProfileRun(
        request(tmp_path),
        settings=settings(extra_args=("--fake-exit-at-start", "3")),
        reporter=QuietReporter(),
    )
    with pytest.raises(EngineStartError) as caught:
        run.run()
    message = str(caught.value)
    assert "exited with code 3" in message
    assert "CUDA out of memory (fake)" in message
    raw = RawRecord.model_validate_json(run.paths.raw.read_text())
    assert raw.incomplete and raw.samples == []


def test_a_vllm_that_never_answers_times_out_and_is_stopped(tmp_path: Path) -> None:
    slow = settings(startup_timeout_s=2.0, extra_args=("--fake-never-healthy",))
    run = ProfileRun(request(tmp_path), settings=slow, reporter=QuietReporter())
    with pytest.raises(EngineStartError, match="did not answer /health within 2s"):
        run.run()
    log_file = next(run.paths.logs.glob("vllm-*.log"))
    assert "fake vLLM starting" in log_file.read_text()


def test_ctrl_c_stops_the_server_and_keeps_partial_samples(tmp_path: Path) -> None:
    urls: list[str] = []
    calls = {"n": 0}

    def clock() -> float:
        calls["n"] += 1
        if calls["n"] == 12:
            raise KeyboardInterrupt
        return float(calls["n"])

    def factory(url: str) -> EngineHttp:
        urls.append(url)
        return EngineHttp(url, settings=settings().connection, clock=clock)

    run = ProfileRun(
        request(tmp_path), settings=settings(), reporter=QuietReporter(), engine_factory=factory
    )
    with pytest.raises(KeyboardInterrupt):
        run.run()
    raw = RawRecord.model_validate_json(run.paths.raw.read_text())
    assert raw.incomplete and raw.reason == "interrupted (Ctrl-C)"
    assert raw.samples
    assert port_is_closed(urls[0])
