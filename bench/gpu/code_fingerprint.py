"""What a users'-traffic launch ran, beyond its commit: one hash over the daemon and plugin
(src/tabletune, pyproject.toml), the profiles it starts from, and the driver and scripts that
run the arms. Commits that change only docs, reports or other benchmarks keep it, so their
launches judge one and the same daemon (traffic_summary.py and table_pooled.py pool launches
of one fingerprint, not only of one commit). Byte contents and relative paths, sorted;
caches left out. It reads the tree the launch runs from: the tabletune wheel installed there
must be built from the same tree (bench/gpu/eval_traffic.sh's usage).

    python3 bench/gpu/code_fingerprint.py        # prints it for this checkout
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PARTS = (
    "src/tabletune",
    "pyproject.toml",
    "profiles",
    "bench/gpu/eval_traffic.py",
    "bench/gpu/eval_traffic.sh",
    "bench/gpu/live_step_time.py",
    "bench/gpu/live_step_time.sh",
    "bench/gpu/live_daemon.py",
    "bench/gpu/traffic.py",
)
SKIPPED = ("__pycache__", ".pyc")


def code_of(meta: dict[str, Any]) -> str:
    """The code a launch ran (its meta's ``code``, recorded from 2026-12-02), else its commit:
    launches of one code judge one daemon, whatever docs or reports their commits changed."""
    return str(meta.get("code") or meta["commit"][:7])


def files_of(root: Path) -> list[Path]:
    """Every file the fingerprint reads under ``root``, sorted by its relative path."""
    out: list[Path] = []
    for part in PARTS:
        path = root / part
        if not path.exists():
            raise FileNotFoundError(f"{part}: not in {root}")
        found = sorted(path.rglob("*")) if path.is_dir() else [path]
        out += [p for p in found if p.is_file() and not any(s in str(p) for s in SKIPPED)]
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def fingerprint(root: Path = ROOT) -> str:
    """The first 16 hex digits of a SHA-256 over each file's relative path and bytes."""
    digest = hashlib.sha256()
    for path in files_of(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


if __name__ == "__main__":
    print(fingerprint(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT))
