"""Bad input to the commands of the house (profile, check, sim, daemon, demo): one line on
stderr naming what is wrong, exit 2, nothing on stdout, before any engine, emulator or server
starts. (solve and compare have their own in test_cli.py.)"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from tabletune.cli.main import main

REPO = Path(__file__).resolve().parents[2]
SAMPLE = str(REPO / "examples" / "sample-profile.json")
NOT_JSON = str(REPO / "README.md")
A_FILE = str(REPO / "README.md")  # a file where a folder is needed
ENGINE = ["--model", "m", "-K", "3", "--max-num-seqs", "8"]


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own exit
        code = stop.code
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 2, err
    assert out == ""
    assert len(lines) == 1, err
    assert lines[0].startswith("tabletune"), err
    return lines[0]


DEMO = [
    (["--speed", "0"], "argument --speed: expected a finite number > 0, got '0'"),
    (["--speed", "fast"], "argument --speed: expected a finite number > 0, got 'fast'"),
    (["--duration", "inf"], "argument --duration: expected a finite number > 0, got 'inf'"),
    (["--interval", "nan"], "argument --interval: expected a finite number > 0, got 'nan'"),
    (["--interval", "60", "--duration", "30"], "--interval 60 is longer than --duration 30"),
    (["--profile", "missing.json"], "missing.json: file not found"),
    (["--profile", NOT_JSON], "README.md: not valid JSON"),
    (["--scenario", "nonexistent"], "nonexistent: no such scenario file"),
    (["--scenario", SAMPLE], "this is a 'tabletune.profile' file, expected 'tabletune.sim"),
    (["--png", f"{A_FILE}/demo.png"], "--png: cannot make the folder"),
    (["--bogus"], "tabletune demo: error: unrecognized arguments: --bogus"),
]


@pytest.mark.parametrize(("args", "message"), DEMO)
def test_demo(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert message in one_line_error(capsys, ["demo", *args])


PROFILE = [
    ([], "the following arguments are required: --model"),
    (["-K", "0"], "argument --num-speculative-tokens/-K: expected an integer >= 1, got '0'"),
    (["--repeats", "0"], "argument --repeats: expected an integer >= 1"),
    (["--ks", "5"], "--ks: each k must be in 0..K=3, got [5]"),
    (["--ks", ""], "--ks: expected non-negative integers, got ''"),
    (["--engine-args", "'unbalanced"], "argument --engine-args: No closing quotation"),
    (["--acceptance-synthetic-rates", "0.5,0.9,0.1"], "must be non-increasing"),
    (["--acceptance-synthetic-rates", "0.5,0.4"], "expected K=3 rates, got 2"),
    (["--batch-sizes", "0,3"], "argument --batch-sizes: expected batch sizes >= 1"),
    (["--port", "70000"], "argument --port: expected a port in 0..65535"),
    (["--acceptance-prompts", "missing.jsonl"], "argument --acceptance-prompts: 'missing"),
    (["--attach", "localhost:8000"], "argument --attach: expected http://HOST:PORT"),
    (["--python", "/nonexistent/python"], "argument --python: '/nonexistent/python' is not"),
    (["--outlier-factor", "0.5"], "argument --outlier-factor: expected a factor > 1"),
    (["-o", f"{A_FILE}/p.json"], "--output: cannot make the folder"),
    (["--timing", "bogus"], "argument --timing: invalid choice: 'bogus'"),
    (["--max-context", "40"], "--max-context 40 leaves no room for a window: it must be at"),
    (["--prefill-rate", "2"], "--prefill-rate and --prefill-tokens go together"),
    (["--prefill-rate", "2", "--prefill-tokens", "9-3"], "--prefill-tokens: expected 1 <= LOW"),
    (["--prefill-tokens", "a-b"], "argument --prefill-tokens: expected LOW-HIGH tokens"),
    (["--cross-check", "1,8", "--timing", "request"], "--cross-check need --timing in-flight"),
    (["--window-steps", "0"], "argument --window-steps: expected an integer >= 1"),
]


@pytest.mark.parametrize(("args", "message"), PROFILE)
def test_profile(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
) -> None:
    base = [] if not args else [*ENGINE, "-o", str(tmp_path / "p.json")]
    assert message in one_line_error(capsys, ["profile", *base, *args])
    assert list(tmp_path.iterdir()) == []  # nothing written, no log folder


CHECK = [
    ([], "the following arguments are required: --model"),
    (["--k", "0"], "argument --k: expected an integer >= 1, got '0'"),
    (["--k", "4"], "check: k=4 must be in 1..K=3"),
    (["--batch-sizes", "1,x"], "argument --batch-sizes: expected comma-separated integers"),
    (["--batch-sizes", "9"], "--batch-sizes: [9] above --max-num-seqs 8"),
    (["--threshold", "-0.1"], "argument --threshold: expected a number >= 0"),
    (["--threshold", "nan"], "argument --threshold: expected a number >= 0"),
    (["--startup-timeout", "0"], "argument --startup-timeout: expected seconds > 0"),
    (["--max-num-seqs", "zero"], "argument --max-num-seqs: expected an integer >= 1"),
    (["--remeasure-rounds", "-1"], "argument --remeasure-rounds: expected an integer >= 0"),
    (["-o", f"{A_FILE}/c.json"], "--output: cannot make the folder"),
    (["--fail-on-warning=yes"], "argument --fail-on-warning: ignored explicit argument"),
    (["--rates", "0.5,0.4"], "check: expected K=3 acceptance rates, got 2"),
    (["--rates", "0.5,0.6,0.1"], "argument --rates: synthetic rates must be non-increasing"),
    (["--capture-size", "0"], "argument --capture-size: expected an integer >= 1"),
    (["--rates", "0.5", "--acceptance", "a.json"], "argument --acceptance: not allowed with"),
    (["--acceptance", "missing.json"], "missing.json: file not found"),
]


@pytest.mark.parametrize(("args", "message"), CHECK)
def test_check(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
) -> None:
    base = [] if not args else [*ENGINE, "-o", str(tmp_path / "c.json")]
    assert message in one_line_error(capsys, ["check", *base, *args])
    assert list(tmp_path.iterdir()) == []


SIM = [
    (["bogus"], "argument SIM_COMMAND: invalid choice: 'bogus'"),
    (["serve"], "the following arguments are required: --scenario"),
    (["serve", "--scenario", "nonexistent"], "nonexistent: no such scenario file"),
    (["serve", "--scenario", "repair", "--speed", "0"], "argument --speed: expected a finite"),
    (["serve", "--scenario", "repair", "--speed", "inf"], "argument --speed: expected a finite"),
    (["serve", "--scenario", "repair", "--port", "70000"], "argument --port: expected a port"),
    (["serve", "--scenario", "repair", "--port", "1", "--ports", "2-3"], "not allowed with"),
    (["serve", "--scenario", "repair", "--ports", "9-1"], "--ports '9-1': need 0 < A <= B"),
    (["serve", "--scenario", "repair", "--profile", "missing.json"], "missing.json: file not"),
    (["check", "--scenario", SAMPLE], "this is a 'tabletune.profile' file, expected"),
    (["check", "--scenario", "repair", "--profile", NOT_JSON], "README.md: not valid JSON"),
    (["list", "extra"], "tabletune sim: error: unrecognized arguments: extra"),
]


@pytest.mark.parametrize(("args", "message"), SIM)
def test_sim(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert message in one_line_error(capsys, ["sim", *args])


DAEMON = [
    ([], {}, "TABLETUNE_PROFILE__PATHS: no profile given"),
    (["--bogus"], {}, "tabletune daemon: error: unrecognized arguments: --bogus"),
    (["extra"], {}, "tabletune daemon: error: unrecognized arguments: extra"),
    (["--once=yes"], {}, "argument --once: ignored explicit argument 'yes'"),
    ([], {"TABLETUNE_LOOP__INTERVAL_S": "abc"}, "TABLETUNE_LOOP__INTERVAL_S: Input should be"),
    ([], {"TABLETUNE_LOOP__INTERVAL_S": "0"}, "TABLETUNE_LOOP__INTERVAL_S: Input should be"),
    ([], {"TABLETUNE_LOG__LEVEL": "loud"}, "TABLETUNE_LOG__LEVEL: Input should be 'debug'"),
    ([], {"TABLETUNE_LOG__FORMAT": "xml"}, "TABLETUNE_LOG__FORMAT: Input should be 'json'"),
    ([], {"TABLETUNE_SERVER__PORT": "99999"}, "TABLETUNE_SERVER__PORT: Input should be less"),
    (
        [],
        {"TABLETUNE_ESTIMATOR__PRIOR_WEIGHT": "-1"},
        "TABLETUNE_ESTIMATOR__PRIOR_WEIGHT: Input should be greater than or equal to 0",
    ),
]


@pytest.fixture
def logs_restored() -> Iterator[None]:
    """The daemon points structlog at this test's stderr; later tests get theirs back."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.mark.parametrize(("args", "env", "message"), DAEMON)
@pytest.mark.usefixtures("logs_restored")
def test_daemon(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
    message: str,
) -> None:
    for name in [n for n in os.environ if n.startswith("TABLETUNE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TABLETUNE_SOURCE__REPLICAS", "http://127.0.0.1:9")
    monkeypatch.setenv("TABLETUNE_LOG__LEVEL", "error")  # the start-up log is not the error
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert message in one_line_error(capsys, ["daemon", "--once", *args])


def test_an_empty_allowed_k_list_is_refused_not_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["solve", "--profile", SAMPLE, "--allowed-k", ""]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "allowed" in err
