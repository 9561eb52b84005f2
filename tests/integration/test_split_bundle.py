"""bench/gpu/split_bundle.sh: build-bundle.sh's three parts re-split into carryable ones."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from tests.support.gpu_jobs import GPU

SCRIPT = GPU / "split_bundle.sh"


def bundle(dest: Path, size: int) -> bytes:
    """A bundle as build-bundle.sh leaves it: its bytes in p1..p3, p3 with the rest."""
    data = bytes(range(256)) * (size // 256)
    third = len(data) // 3
    for n, chunk in enumerate((data[:third], data[third : 2 * third], data[2 * third :])):
        (dest / f"p{n + 1}").mkdir(parents=True)
        (dest / f"p{n + 1}" / f"part.{n}").write_bytes(chunk)
    p3 = dest / "p3"
    (p3 / "bundle.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    (p3 / "device-setup.sh").write_text("echo set up\n")
    (p3 / "models").mkdir()
    (p3 / "models" / "config.json").write_text("{}")
    return data


def split(dest: Path, part_mb: str | None = "1") -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"} | ({} if part_mb is None else {"PART_MB": part_mb})
    command = ["bash", str(SCRIPT), str(dest)]
    return subprocess.run(
        command, env=env, cwd=dest.parent, capture_output=True, text=True, check=False
    )


def test_the_parts_join_to_the_bundle_in_name_order_and_the_rest_moves_to_j(
    tmp_path: Path,
) -> None:
    dest = tmp_path / ".gpu-bundle"
    data = bundle(dest, 3 * 1024 * 1024 + 4096)
    done = split(dest)
    assert done.returncode == 0, done.stderr
    parts = sorted(dest.glob("e*/part.*"))
    assert [p.parent.name for p in parts] == ["e00", "e01", "e02", "e03"]
    assert all(p.stat().st_size <= 1024 * 1024 for p in parts)
    assert b"".join(p.read_bytes() for p in sorted(parts, key=lambda p: p.name)) == data
    assert sorted(p.name for p in (dest / "j").iterdir()) == [
        "bundle.sha256", "device-setup.sh", "models"]  # fmt: skip
    assert not any((dest / p).exists() for p in ("p1", "p2", "p3"))
    assert sorted(p.name for p in dest.iterdir()) == ["e00", "e01", "e02", "e03", "j"]


def test_parts_that_do_not_join_to_the_checksum_change_nothing(tmp_path: Path) -> None:
    dest = tmp_path / ".gpu-bundle"
    bundle(dest, 64 * 1024)
    (dest / "p2" / "part.1").write_bytes(b"not the bundle")
    before = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
    done = split(dest)
    assert done.returncode == 1 and "do not join" in done.stderr
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == before


def test_a_bundle_already_split_or_a_bad_size_is_a_one_line_error(tmp_path: Path) -> None:
    dest = tmp_path / ".gpu-bundle"
    bundle(dest, 64 * 1024)
    done = split(dest, part_mb="0")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "PART_MB" in done.stderr
    assert split(dest).returncode == 0
    done = split(dest)
    assert done.returncode == 2 and "split already" in done.stderr


def test_outside_a_git_checkout_the_parts_are_10_mib(tmp_path: Path) -> None:
    # In a checkout the size is what the tree leaves of a device call's 64 MiB, less 2 MiB.
    dest = tmp_path / ".gpu-bundle"
    data = bundle(dest, 10 * 1024 * 1024 + 512 * 1024)
    done = split(dest, part_mb=None)
    assert done.returncode == 0, done.stderr
    sizes = [p.stat().st_size for p in sorted(dest.glob("e*/part.*"))]
    assert sizes == [10 * 1024 * 1024, len(data) - 10 * 1024 * 1024]
