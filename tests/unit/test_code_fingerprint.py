"""bench/gpu/code_fingerprint.py: what a users'-traffic launch ran, beyond its commit."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.gpu_jobs import ROOT, load_gpu_module

code_fingerprint = load_gpu_module("code_fingerprint")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of what the fingerprint reads, and a doc and a report beside it."""
    for part in code_fingerprint.PARTS:
        source, target = ROOT / part, tmp_path / part
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, target)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/results.md").write_text("a result\n")
    (tmp_path / "bench/gpu/eval_traffic_report.py").write_text("# a report script\n")
    return tmp_path


def test_docs_and_reports_leave_it_and_the_daemon_or_driver_move_it(tree: Path) -> None:
    before = code_fingerprint.fingerprint(tree)
    (tree / "docs/results.md").write_text("another result\n")
    (tree / "bench/gpu/eval_traffic_report.py").write_text("# another report script\n")
    (tree / "src/tabletune/__pycache__").mkdir(exist_ok=True)
    (tree / "src/tabletune/__pycache__/x.pyc").write_bytes(b"\0")
    assert code_fingerprint.fingerprint(tree) == before
    for changed in ("src/tabletune/daemon/setting_groups.py", "bench/gpu/eval_traffic.py"):
        path = tree / changed
        kept = path.read_text()
        path.write_text(kept + "\n# changed\n")
        assert code_fingerprint.fingerprint(tree) != before, changed
        path.write_text(kept)
    assert code_fingerprint.fingerprint(tree) == before


def test_a_file_moved_is_another_code(tree: Path) -> None:
    before = code_fingerprint.fingerprint(tree)
    src = tree / "src/tabletune/daemon/oversold.py"
    src.rename(tree / "src/tabletune/daemon/oversold_moved.py")
    assert code_fingerprint.fingerprint(tree) != before


def test_a_part_missing_is_a_clear_error(tree: Path) -> None:
    (tree / "bench/gpu/eval_traffic.sh").unlink()
    with pytest.raises(FileNotFoundError, match=r"eval_traffic\.sh"):
        code_fingerprint.fingerprint(tree)
