"""A ``tabletune sim serve`` subprocess on a free port, for the demo and the end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tabletune.admin.auth import OPEN_ENV, OPEN_LOOPBACK, TOKEN_ENV, TOKEN_FILE_ENV
from tabletune.errors import TemporaryError


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def last_line(log_path: Path) -> str:
    """The last non-empty line of the emulator's output: its own error, when it exits early."""
    text = log_path.read_text(encoding="utf-8", errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


@contextlib.contextmanager
def emulator(
    *,
    scenario: str,
    profile: Path | None,
    speed: float,
    port: int | None = None,
    log_path: Path | None = None,
    timeout_s: float = 30.0,
    admin_token: str | None = None,
) -> Iterator[str]:
    """Yields the base URL of an emulator that answers ``/health``; stops it on exit.

    Its output goes to ``log_path`` (a temporary file when None): when it exits before
    answering, the error raised carries its last line, e.g. the scenario it could not read.
    Its admin API takes ``admin_token``, or without one writes from this machine only
    (``TABLETUNE_ADMIN_OPEN=loopback``).
    """
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV, OPEN_ENV)}
    env.update({TOKEN_ENV: admin_token} if admin_token else {OPEN_ENV: OPEN_LOOPBACK})
    command = [
        sys.executable,
        "-m",
        "tabletune.cli.main",
        "sim",
        "serve",
        "--scenario",
        scenario,
        "--port",
        str(port),
        "--speed",
        f"{speed:g}",
    ]
    if profile is not None:
        command += ["--profile", str(profile)]
    with contextlib.ExitStack() as stack:
        if log_path is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="tabletune-sim-"))
            log_path = Path(folder) / "emulator.log"
        log = stack.enter_context(open(log_path, "wb"))
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        stack.callback(_stop, process)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise TemporaryError(
                    f"the emulator (tabletune sim serve) exited with {process.returncode}: "
                    f"{last_line(log_path)}"
                )
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TemporaryError(f"the emulator did not answer on {url} in {timeout_s} s")
            time.sleep(0.1)
        yield url


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
