"""Starting and always stopping a vLLM server for the profiler.

The command and environment are pure functions of the settings (tests pin them); the process
is a context manager that waits for /health, fails with the tail of the log when vLLM exits or
does not come up in time, and stops the whole process group on the way out, whatever happened.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabletune.admin.auth import OPEN_ENV, OPEN_LOOPBACK
from tabletune.errors import InputError
from tabletune.profiler.errors import EngineStartError
from tabletune.profiler.hook_protocol import SamplerMode
from tabletune.profiler.settings import LaunchSettings
from tabletune.solver import Range

log = logging.getLogger("tabletune.profiler")

PLUGINS = "tabletune_engine,tabletune_http,tabletune_metrics,tabletune_profiler"
SYNC_ENV = "TABLETUNE_SYNC_INTERVAL_S"
"""the plugin's sync interval (docs/plugin.md): how fresh the step cells on /metrics are"""


@dataclass(frozen=True)
class EngineSpec:
    """One vLLM launch: the model, its drafter and how speculation starts."""

    model: str
    max_num_seqs: int
    drafter: str | None = None
    method: str | None = None
    num_speculative_tokens: int = 0
    """K; 0 = no speculation at all"""
    starting_table: tuple[Range, ...] | None = None
    """None: a static K (no table); otherwise every k that will ever be set must appear"""
    sampler: SamplerMode | None = None

    @property
    def speculative(self) -> bool:
        return self.num_speculative_tokens > 0


def starting_table(ks: Sequence[int], max_num_seqs: int) -> tuple[Range, ...]:
    """A table holding every k once (vLLM captures CUDA graphs only for the starting table's k):
    one batch size per k from the largest down, the last k over the rest."""
    ordered = sorted(set(ks), reverse=True)
    if not ordered:
        raise InputError("no k to put in the starting table")
    if len(ordered) > max_num_seqs:
        raise InputError(f"{len(ordered)} k values need max_num_seqs >= {len(ordered)}")
    ranges: list[Range] = [(i + 1, i + 1, k) for i, k in enumerate(ordered[:-1])]
    ranges.append((len(ordered), max_num_seqs, ordered[-1]))
    return tuple(ranges)


def speculative_config(spec: EngineSpec) -> dict[str, Any] | None:
    if not spec.speculative:
        return None
    config: dict[str, Any] = {"num_speculative_tokens": spec.num_speculative_tokens}
    if spec.method:
        config["method"] = spec.method
    if spec.drafter:
        config["model"] = spec.drafter
    if spec.starting_table is not None:
        config["num_speculative_tokens_per_batch_size"] = [list(r) for r in spec.starting_table]
    if spec.sampler is not None:
        config.update(spec.sampler.speculative_config())
    return config


def build_command(spec: EngineSpec, *, settings: LaunchSettings, port: int) -> list[str]:
    command = [
        settings.python,
        "-m",
        settings.server_module,
        "--model",
        spec.model,
        "--host",
        settings.host,
        "--port",
        str(port),
        "--max-num-seqs",
        str(spec.max_num_seqs),
    ]
    config = speculative_config(spec)
    if config is not None:
        command += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    return command + list(settings.extra_args)


def server_env(settings: LaunchSettings, base: Mapping[str, str]) -> dict[str, str]:
    """The plugin (all three parts) and the profiler hook, which needs vLLM's dev-mode RPC.
    The admin API takes the profiler's writes from this machine unless a token is set."""
    env = dict(base)
    env.setdefault("VLLM_PLUGINS", PLUGINS)
    env.setdefault("VLLM_SERVER_DEV_MODE", "1")
    env.setdefault(OPEN_ENV, OPEN_LOOPBACK)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(dict(settings.env))
    return env


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


@dataclass
class RunningServer:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    start_s: float
    """seconds from launch to /health answering"""


def stop_process(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGINT the process group (vLLM shuts down cleanly on it), then SIGTERM, then SIGKILL."""
    if process.poll() is not None:
        return
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=timeout_s if sig != signal.SIGKILL else None)
            return
        except subprocess.TimeoutExpired:
            log.warning("server did not stop on %s; escalating", signal.Signals(sig).name)


@contextmanager
def launched(
    spec: EngineSpec,
    *,
    settings: LaunchSettings,
    log_path: Path,
    healthy: Callable[[str], bool],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = 1.0,
) -> Iterator[RunningServer]:
    """Start vLLM, wait until ``healthy(base_url)``, yield, and always stop it."""
    port = settings.port or free_port(settings.host)
    command = build_command(spec, settings=settings, port=port)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log.info("starting vLLM: %s (log: %s)", " ".join(command), log_path)
    started = clock()
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=server_env(settings, os.environ),
            start_new_session=True,  # its own process group: stopping it stops its children
        )
    base_url = f"http://{settings.host}:{port}"
    try:
        while not healthy(base_url):
            if process.poll() is not None:
                raise EngineStartError(
                    f"vLLM exited with code {process.returncode} before serving; last lines of "
                    f"{log_path}:\n{log_tail(log_path, settings.log_tail_lines)}"
                )
            if clock() - started > settings.startup_timeout_s:
                raise EngineStartError(
                    f"vLLM did not answer /health within {settings.startup_timeout_s:.0f}s; "
                    f"last lines of {log_path}:\n{log_tail(log_path, settings.log_tail_lines)}"
                )
            sleep(poll_s)
        server = RunningServer(base_url, process, log_path, clock() - started)
        log.info("vLLM up at %s after %.1fs", base_url, server.start_s)
        yield server
    finally:
        stop_process(process, settings.stop_timeout_s)
