"""solve/compare end to end through main(): the paper's answers and clear errors."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tabletune.cli import main as cli_main
from tabletune.cli.inputs import parse_k_list
from tabletune.cli.main import main
from tabletune.errors import InputError
from tabletune.schemas import save_model
from tabletune.schemas.profile import Cell
from tests.unit.references import H200, H200_EXACT_TABLE, profile_of

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample-profile.json"


def worked_profile(tmp_path: Path, t1: float, t3: float) -> Path:
    cells = (
        Cell(batch_size=1, k=1, samples_ms=(t1,), step_ms=t1),
        Cell(batch_size=1, k=3, samples_ms=(t3,), step_ms=t3),
    )
    profile = profile_of(cells, rates=(0.7, 0.5, 0.3), gpu="worked example")
    path = tmp_path / f"worked-{t1}-{t3}.json"
    save_model(profile, path)
    return path


@pytest.mark.parametrize(("t1", "t3", "k"), [(5.0, 8.0, 1), (4.5, 6.0, 3)])
def test_solve_gives_the_paper_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], t1: float, t3: float, k: int
) -> None:
    assert main(["solve", "--profile", str(worked_profile(tmp_path, t1, t3)), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [[1, 1, k]]


def test_compare_reports_the_paper_loss(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = worked_profile(tmp_path, 5.0, 8.0)
    out = tmp_path / "cmp.json"
    code = main(
        ["compare", "--profile", str(profile), "--table", "[[1,1,3]]", "--json-out", str(out)]
    )
    assert code == 0
    result = json.loads(out.read_text())
    assert result["tables"]["tabletune"]["worst_loss"] == 0.0
    # k=3 instead of k=1: 1 - 0.3125 / 0.34
    assert result["tables"]["[[1,1,3]]"]["worst_loss"] == pytest.approx(1 - 0.3125 / 0.34)
    assert "tabletune" in capsys.readouterr().out


def test_solve_honours_allowed_k_and_writes_output(tmp_path: Path) -> None:
    out = tmp_path / "table.json"
    args = ["solve", "--profile", str(SAMPLE), "--allowed-k", "0,1", "--output", str(out)]
    assert main(args) == 0
    assert {r[2] for r in json.loads(out.read_text())} <= {0, 1}


def test_solve_with_confidence_0_is_the_old_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["solve", "--profile", str(H200), "--confidence", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [list(r) for r in H200_EXACT_TABLE]


def test_solve_by_default_does_not_flip_on_the_noisy_cell_at_128(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["solve", "--profile", str(H200), "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert [k for start, end, k in table if start <= 128 <= end] == [3]
    assert len(table) < len(H200_EXACT_TABLE)


def test_solve_min_width_and_the_readable_view(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["solve", "--profile", str(H200), "--min-width", "5"]) == 0
    out = capsys.readouterr().out
    table = json.loads(out.split('"num_speculative_tokens_per_batch_size": ')[1].splitlines()[0])
    assert min(end - start + 1 for start, end, _ in table) >= 5
    assert "confidence z=1" in out and "min width 5" in out
    rows = [line for line in out.splitlines() if re.match(r" +\d+\.\.\d+ ", line)]
    assert len(rows) == len(table) and all(" ± " in row for row in rows)  # goodput with sigma
    assert "took over" in out  # a min-width merge says so


def test_compare_uses_the_same_settings_for_its_own_table(tmp_path: Path) -> None:
    out = tmp_path / "cmp.json"
    assert main(["compare", "--profile", str(H200), "--json-out", str(out)]) == 0
    noise_aware = json.loads(out.read_text())
    assert noise_aware["settings"] == {"stickiness": 0.005, "confidence": 1.0, "min_width": 1}
    assert (
        main(["compare", "--profile", str(H200), "--json-out", str(out), "--confidence", "0"]) == 0
    )
    exact = json.loads(out.read_text())["tables"]["tabletune"]
    assert exact["worst_loss"] <= 0.005  # exact T: within the stickiness of the best fixed k
    # judged by the profile's own medians, not switching inside the noise costs something
    assert noise_aware["tables"]["tabletune"]["worst_loss"] > exact["worst_loss"]


def test_compare_plot_writes_a_png(tmp_path: Path) -> None:
    png = tmp_path / "loss.png"
    assert main(["compare", "--profile", str(SAMPLE), "--table", "docs", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["solve", "--profile", "missing.json"], "missing.json: file not found"),
        (["solve", "--profile", str(SAMPLE), "--allowed-k", "a,b"], "--allowed-k"),
        (["solve", "--profile", str(SAMPLE), "--allowed-k", "7"], "not profiled"),
        (["solve", "--profile", str(SAMPLE), "--max-batch", "999"], "--max-batch"),
        (
            ["solve", "--profile", str(SAMPLE), "--confidence", "-1"],
            "confidence must be a finite number >= 0",
        ),
        (
            ["compare", "--profile", str(SAMPLE), "--min-width", "0"],
            "min_width must be an integer >= 1",
        ),
        (["compare", "--profile", str(SAMPLE), "--table", "[[2,4,1]]"], "start at 1"),
        (
            ["compare", "--profile", str(SAMPLE), "--table", "[[1,4,9]]"],
            "exceeds the drafter's K=3",
        ),
    ],
)
def test_bad_input_gives_one_clear_error(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_broken_profile_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema_version": 1, "kind": "tabletune.profile"}')
    assert main(["solve", "--profile", str(broken)]) == 2
    assert f"{broken}: metadata: Field required" in capsys.readouterr().err


# --- the entry point: every command listed, missing extras, paths, broken pipes ---------------

PART_COMMANDS = {
    "profile": "profiler",
    "check": "profiler",
    "sim": "sim",
    "daemon": "daemon",
    "demo": "demo",
}
# What each part's extra brings and the core install lacks.
EXTRA_ONLY = [
    "yaml",
    "httpx",
    "structlog",
    "rich",
    "matplotlib",
    "fastapi",
    "uvicorn",
    "prometheus_client",
    "prometheus_api_client",
    "apscheduler",
    "tenacity",
    "pydantic_settings",
]


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out
    for command in ["solve", "compare", *PART_COMMANDS]:
        assert f"    {command} " in listed, command


@pytest.mark.parametrize("command", PART_COMMANDS)
@pytest.mark.parametrize("rest", [[], ["--help"], ["list", "--once", "-K", "3"]])
def test_a_part_whose_extra_is_missing_names_the_extra_whatever_follows(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    rest: list[str],
) -> None:
    real_import = importlib.import_module
    extra = PART_COMMANDS[command]

    def without_dependency(name: str, package: str | None = None) -> Any:
        part = next(p for p in cli_main.PARTS if p.module == name)
        if part.extra == extra:
            raise ModuleNotFoundError("No module named 'somelib'", name="somelib")
        return real_import(name, package)

    monkeypatch.setattr(cli_main.importlib, "import_module", without_dependency)
    assert main([command, *rest]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"tabletune {command}: needs the [{extra}] extra (somelib is not installed): "
        f"pip install 'tabletune[{extra}]'\n"
    )


def test_a_core_part_that_cannot_be_imported_is_a_bug_not_a_missing_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(name: str, package: str | None = None) -> Any:
        raise ModuleNotFoundError("No module named 'numpy'", name="numpy")

    monkeypatch.setattr(cli_main.importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError):
        main(["solve"])


def test_with_the_core_install_only_every_command_answers(tmp_path: Path) -> None:
    """A fresh interpreter where every extra's library is missing (as after
    ``pip install tabletune``): solve works, the others name their extra."""
    script = tmp_path / "core_only.py"
    script.write_text(
        "import contextlib, io, json, sys\n"
        f"for name in {EXTRA_ONLY!r}:\n"
        "    sys.modules[name] = None  # import raises ModuleNotFoundError\n"
        "from tabletune.cli.main import main\n"
        f"for command in {[*PART_COMMANDS, 'solve']!r}:\n"
        "    err = io.StringIO()\n"
        "    args = ['--profile', sys.argv[1], '--json'] if command == 'solve' else ['--once']\n"
        "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):\n"
        "        code = main([command, *args])\n"
        "    print(json.dumps([command, code, err.getvalue()]))\n"
    )
    done = subprocess.run(
        [sys.executable, str(script), str(SAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    answers = {c: (code, err) for c, code, err in map(json.loads, done.stdout.splitlines())}
    assert answers.pop("solve") == (0, "")
    for command, (code, err) in answers.items():
        extra = PART_COMMANDS[command]
        assert code == 2
        assert err.startswith(f"tabletune {command}: needs the [{extra}] extra (")
        assert err.endswith(f"pip install 'tabletune[{extra}]'\n")


def test_an_output_into_a_missing_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "no" / "such" / "table.json"
    assert main(["solve", "--profile", str(SAMPLE), "--output", str(out)]) == 2
    assert capsys.readouterr().err == (f"tabletune: error: {out}: No such file or directory\n")


def test_a_reader_that_leaves_early_gets_no_traceback() -> None:
    """``tabletune sim list | head -0``: the pipe is closed before anything is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tabletune.cli.main", "sim", "list"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert done.stderr == b""
    assert done.returncode == 1


@pytest.mark.parametrize("text", ["", ",", " , ", "1,-1", "x"])
def test_an_empty_or_bad_k_list_is_refused(text: str) -> None:
    with pytest.raises(InputError, match=r"^--allowed-k: expected"):
        parse_k_list(text)
