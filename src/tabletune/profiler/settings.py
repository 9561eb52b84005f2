"""The profiler's settings: one object of grouped, documented dataclasses, built once by the
CLI and passed down as ``settings=``. ``tests/unit/test_profiler_settings.py`` pins every default.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Literal

from tabletune.schemas.shape import PrefillStream


@dataclass(frozen=True)
class GridSettings:
    """Which batch sizes are measured."""

    dense_until: int = 16
    """every batch size 1..dense_until is measured (small B is where k matters most)"""
    step: int = 8
    """above dense_until, every ``step`` batch sizes up to max_num_seqs (which is always kept)"""
    explicit: tuple[int, ...] = ()
    """if given, exactly these batch sizes (e.g. a dense region where T depends on the exact
    token count); replaces dense_until/step"""


@dataclass(frozen=True)
class TimingSettings:
    """How the cells are timed, by either method (docs/profiler.md, "Method")."""

    method: Literal["in-flight", "request"] = "in-flight"
    """in-flight: B requests kept decoding, k switched at run time, steps read from the
    plugin's step cells; request: step = (t(1 + decode_tokens) - t(1)) / decode_tokens of whole
    requests"""
    prompt_tokens: int = 32
    """length of each synthetic prompt (token ids, fresh for every request: no prefix-cache hits)"""
    decode_tokens: int = 64
    """request method: extra output tokens of the long request; the difference with the 1-token
    request is ``decode_tokens`` pure decode steps"""
    repeats: int = 3
    """samples per cell (in-flight: windows, interleaved); the cell's step time is their median"""
    warmup_batches: tuple[int, ...] = (1, 8, 64)
    """batch sizes run once (not recorded) at each k before timing, clipped to max_num_seqs"""
    outlier_factor: float = 1.5
    """a cell whose median stands out from every grid neighbour (same k) by more than this
    factor, in the same direction, is re-measured"""
    remeasure_rounds: int = 1
    """extra rounds of ``repeats`` samples for suspicious cells; still jumpy after: flagged noisy"""
    token_id_low: int = 1000
    token_id_high: int = 30000
    """prompt token ids are drawn from [low, high): valid for any vocabulary of >= 32k tokens"""
    seed: int = 0


@dataclass(frozen=True)
class InFlightSettings:
    """The in-flight method: how long a window is, how requests are kept, what rides along."""

    window_steps: int = 8
    """a window (one sample) ends once this many steps at (B, k) are counted (read through the
    admin API's step-cells route: within a step of the last one; through /metrics, on the first
    sync that shows them: at small B a sync interval holds ~10 steps, so a window holds ~8-20)..."""
    window_max_s: float = 0.25
    """...or once its steps took this long, if it has ``min_window_steps`` (slow cells)"""
    min_window_steps: int = 4
    max_context: int = 256
    """requests are replaced by fresh ones before the oldest one's context passes this"""
    poll_s: float = 0.002
    """the shortest wait between two readings of the step-cells route (each one small call into
    the engine, answered after the step it is running; waits are planned from step times)"""
    idle_steps: float = 3.0
    """with the route, the engine has stopped once no step was counted for this many of the
    longest recent steps (steps run back to back while requests remain)"""
    metrics_poll_s: float = 0.02
    """on a server without the route (an older plugin): how often /metrics is read"""
    sync_interval_s: float = 0.05
    """TABLETUNE_SYNC_INTERVAL_S of a launched server: how fresh the step cells exported on
    /metrics are (each sync is one small call into the engine; there, windows end on syncs)"""
    window_timeout_s: float = 60.0
    """no window at (B, k) for this long: the engine is not running the requests; stop"""
    attempts: int = 4
    """a window that is not exactly B requests decoding is taken again, up to this many times"""
    prefill_stream: PrefillStream | None = None
    """traffic-faithful timing: one-token requests at this rate and prompt lengths run in the
    background, their prefill riding along with the timed decode steps"""
    cross_check: tuple[int, ...] = ()
    """batch sizes re-timed with the request method (every k, same launch) to show that both
    methods agree on pure decode; the summary gives the agreement"""


@dataclass(frozen=True)
class AcceptanceSettings:
    """How a^prior is measured: the longest K, the serving sampler, a prompt set."""

    num_prompts: int = 320
    """prompts used (the bundled set holds 325)"""
    max_tokens: int = 128
    temperature: float = 0.0
    """the serving temperature (0: greedy)"""
    concurrency: int = 32
    """prompts per request (vLLM runs a list of prompts as that many concurrent requests)"""
    prompts_path: str | None = None
    """JSONL: {"prompt": "text"} or {"prompt_token_ids": [...]} per line; None: the bundled chat
    prompts when the server has a tokenizer, else synthetic token ids"""
    synthetic_rates: tuple[float, ...] | None = None
    """test mode: the engine's synthetic sampler with these a_i instead of the serving sampler
    (acceptance then must come back as set: a check of the whole counting path)"""
    enabled: bool = True


@dataclass(frozen=True)
class ConnectionSettings:
    """HTTP to the engine, with the retry schedule applied at this one I/O edge."""

    request_timeout_s: float = 300.0
    admin_token: str | None = None
    retry_backoffs_s: tuple[float, ...] = (1.0, 2.0, 4.0)
    """waits before retry 1, 2, 3 of a request that failed for a temporary reason"""


@dataclass(frozen=True)
class LaunchSettings:
    """How ``tabletune profile`` starts vLLM (ignored with --attach)."""

    python: str = sys.executable
    """the Python that has vLLM (default: the one running the profiler)"""
    server_module: str = "vllm.entrypoints.openai.api_server"
    """run as ``python -m``; tests point it at a fake engine"""
    host: str = "127.0.0.1"
    port: int = 0
    """0: a free port"""
    startup_timeout_s: float = 900.0
    stop_timeout_s: float = 30.0
    log_tail_lines: int = 40
    extra_args: tuple[str, ...] = ()
    """passed to vLLM verbatim (e.g. --load-format dummy --skip-tokenizer-init)"""
    env: tuple[tuple[str, str], ...] = ()
    """extra environment for the server"""


@dataclass(frozen=True)
class ProfilerSettings:
    grid: GridSettings = field(default_factory=GridSettings)
    timing: TimingSettings = field(default_factory=TimingSettings)
    in_flight: InFlightSettings = field(default_factory=InFlightSettings)
    acceptance: AcceptanceSettings = field(default_factory=AcceptanceSettings)
    connection: ConnectionSettings = field(default_factory=ConnectionSettings)
    launch: LaunchSettings = field(default_factory=LaunchSettings)
