"""The ``profile`` and ``check`` subcommands: settings from flags, a run end to end, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tabletune.cli.main import build_parser, main
from tabletune.profiler.cli import settings_from
from tabletune.profiler.settings import (
    AcceptanceSettings,
    ConnectionSettings,
    GridSettings,
    InFlightSettings,
    LaunchSettings,
    ProfilerSettings,
    TimingSettings,
)
from tests.unit.test_profiler_fake_engine import FakeConfig, FakeEngine

ENGINE = ["--model", "/m/qwen3-4b", "--drafter", "/m/eagle3", "-K", "3", "--max-num-seqs", "4"]


def test_defaults_are_pinned() -> None:
    assert GridSettings() == GridSettings(dense_until=16, step=8, explicit=())
    assert TimingSettings() == TimingSettings(
        method="in-flight",
        prompt_tokens=32,
        decode_tokens=64,
        repeats=3,
        warmup_batches=(1, 8, 64),
        outlier_factor=1.5,
        remeasure_rounds=1,
        token_id_low=1000,
        token_id_high=30000,
        seed=0,
    )
    assert InFlightSettings() == InFlightSettings(
        window_steps=8,
        window_max_s=0.25,
        min_window_steps=4,
        max_context=256,
        poll_s=0.002,
        idle_steps=3.0,
        metrics_poll_s=0.02,
        sync_interval_s=0.05,
        window_timeout_s=60.0,
        attempts=4,
        prefill_stream=None,
        cross_check=(),
    )
    assert AcceptanceSettings() == AcceptanceSettings(
        num_prompts=320,
        max_tokens=128,
        temperature=0.0,
        concurrency=32,
        prompts_path=None,
        synthetic_rates=None,
        enabled=True,
    )
    assert ConnectionSettings() == ConnectionSettings(
        request_timeout_s=300.0, admin_token=None, retry_backoffs_s=(1.0, 2.0, 4.0)
    )
    launch = LaunchSettings()
    assert (launch.server_module, launch.host, launch.port) == (
        "vllm.entrypoints.openai.api_server",
        "127.0.0.1",
        0,
    )
    assert (launch.startup_timeout_s, launch.stop_timeout_s, launch.log_tail_lines) == (
        900.0,
        30.0,
        40,
    )


def test_flags_build_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TABLETUNE_ADMIN_TOKEN", "s3cret")
    args = build_parser().parse_args(
        [
            *["profile", *ENGINE, "-o", "p.json", "--engine-args", "--load-format dummy --x 'a b'"],
            *["--repeats", "5", "--decode-tokens", "32", "--acceptance-synthetic-rates", "0.7,0.5"],
            *["--dense-until", "8", "--grid-step", "4", "--no-acceptance"],
        ]
    )
    settings = settings_from(args)
    assert settings.launch.extra_args == ("--load-format", "dummy", "--x", "a b")
    assert (settings.timing.repeats, settings.timing.decode_tokens) == (5, 32)
    assert settings.acceptance.synthetic_rates == (0.7, 0.5)
    assert not settings.acceptance.enabled
    assert settings.grid == GridSettings(dense_until=8, step=4)
    assert settings.connection.admin_token == "s3cret"
    assert settings_from(build_parser().parse_args(["check", *ENGINE])).grid == GridSettings()
    dense = build_parser().parse_args(
        ["profile", *ENGINE, "-o", "p.json", "--batch-sizes", "3,1,2"]
    )
    assert settings_from(dense).grid.explicit == (3, 1, 2)
    assert ProfilerSettings().timing == TimingSettings()


def test_profile_attached_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeEngine(
        FakeConfig(
            step_ms=lambda b, k: 20.0,
            prefill_ms=0.0,
            overhead_ms=0.0,
            max_num_seqs=4,
            starting_table=[[1, 1, 3], [2, 2, 2], [3, 3, 1], [4, 4, 0]],
        )
    )
    fake.real_time = True
    output = tmp_path / "p.json"
    with fake.serve() as url:
        code = main(
            [
                *["profile", *ENGINE, "--attach", url, "-o", str(output), "--gpu", "FAKE"],
                *["--timing", "request"],
                *[
                    "--dense-until",
                    "2",
                    "--grid-step",
                    "2",
                    "--repeats",
                    "1",
                    "--decode-tokens",
                    "4",
                ],
                *[
                    "--warmup-batches",
                    "1",
                    "--acceptance-num-prompts",
                    "8",
                    "--acceptance-max-tokens",
                    "9",
                ],
                *["--acceptance-synthetic-rates", "0.5,0.25,0.1"],
            ]
        )
    assert code == 0
    summary = json.loads(output.with_name("p.summary.json").read_text())
    assert summary["batch_grid"] == [1, 2, 4]
    assert summary["acceptance"]["rates"] == [0.5, 0.25, 0.1]
    assert summary["table"][0][0] == 1
    assert "acceptance: a = (0.500, 0.250, 0.100)" in capsys.readouterr().err


def test_an_error_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeEngine(FakeConfig(plugin=False, max_num_seqs=4))
    with fake.serve() as url:
        code = main(["profile", *ENGINE, "--attach", url, "-o", str(tmp_path / "p.json")])
    assert code == 2
    assert "has no TableTune admin API" in capsys.readouterr().err
    assert (tmp_path / "p.raw.json").exists()
