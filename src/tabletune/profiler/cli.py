"""``tabletune profile`` and ``tabletune check`` (registered by ``tabletune.cli.main``)."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import signal
import sys
from pathlib import Path
from typing import Literal

from tabletune.cli.inputs import make_output_folder, number_type, parse_k_list
from tabletune.errors import InputError
from tabletune.profiler import check as engine_check
from tabletune.profiler.check import (
    CheckRequest,
    EngineCheck,
    arm_logs,
    launching_arms,
    logs_folder,
    write_check,
)
from tabletune.profiler.hook_protocol import SamplerMode
from tabletune.profiler.progress import RichReporter
from tabletune.profiler.run import ProfileRequest, ProfileRun
from tabletune.profiler.settings import (
    AcceptanceSettings,
    ConnectionSettings,
    GridSettings,
    InFlightSettings,
    LaunchSettings,
    ProfilerSettings,
    TimingSettings,
)
from tabletune.schemas import load_acceptance
from tabletune.schemas.shape import PrefillStream


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None


_positive_int = number_type(int, lambda v: v >= 1, "an integer >= 1")
_non_negative_int = number_type(int, lambda v: v >= 0, "an integer >= 0")
_port = number_type(int, lambda v: 0 <= v <= 65535, "a port in 0..65535 (0: a free one)")
_seconds = number_type(float, lambda v: 0 < v < float("inf"), "seconds > 0")
_non_negative = number_type(float, lambda v: 0 <= v < float("inf"), "a number >= 0")
_factor = number_type(float, lambda v: 1 < v < float("inf"), "a factor > 1")


def _batch_list(text: str) -> tuple[int, ...]:
    values = _ints(text)
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected batch sizes >= 1, got {text!r}")
    return values


def _token_range(text: str) -> tuple[int, int]:
    low, dash, high = text.partition("-")
    try:
        values = (int(low), int(high if dash else low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW-HIGH tokens, got {text!r}") from None
    if not 1 <= values[0] <= values[1]:
        raise argparse.ArgumentTypeError(f"expected 1 <= LOW <= HIGH, got {text!r}")
    return values


def _rates(text: str) -> tuple[float, ...]:
    rates = _floats(text)
    try:
        SamplerMode("synthetic", rates)  # in [0, 1], non-increasing: the hook's own check
    except InputError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return rates


def _engine_args(text: str) -> str:
    try:
        shlex.split(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{error} in {text!r}") from None
    return text


def _executable(text: str) -> str:
    if shutil.which(text) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an executable (or not on PATH)")
    return text


def _readable_file(text: str) -> str:
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a file")
    return text


def _url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"expected http://HOST:PORT, got {text!r}")
    return text


def _engine_arguments(parser: argparse.ArgumentParser) -> None:
    engine = parser.add_argument_group("engine")
    engine.add_argument("--model", required=True, help="target model (path or name)")
    engine.add_argument("--drafter", help="draft model (path or name)")
    engine.add_argument("--method", default="eagle3", help="speculative method (default eagle3)")
    engine.add_argument(
        "--num-speculative-tokens",
        "-K",
        type=_positive_int,
        required=True,
        help="K, the longest k",
    )
    engine.add_argument(
        "--max-num-seqs", type=_positive_int, required=True, help="vLLM's --max-num-seqs"
    )
    engine.add_argument(
        "--engine-args",
        type=_engine_args,
        default="",
        help="extra vLLM arguments, one string (e.g. '--load-format dummy --skip-tokenizer-init')",
    )
    engine.add_argument(
        "--python", type=_executable, default=sys.executable, help="Python that has vLLM"
    )
    engine.add_argument(
        "--server-module",
        default=LaunchSettings.server_module,
        help="module run as the server (default vLLM's OpenAI server)",
    )
    engine.add_argument("--port", type=_port, default=0, help="0: a free port")
    engine.add_argument(
        "--startup-timeout", type=_seconds, default=900.0, help="seconds (default 900)"
    )
    timing = parser.add_argument_group("timing")
    timing.add_argument(
        "--repeats", type=_positive_int, default=3, help="samples per cell (default 3)"
    )
    timing.add_argument(
        "--decode-tokens",
        type=_positive_int,
        default=64,
        help="decode steps timed per sample (default 64)",
    )
    timing.add_argument(
        "--prompt-tokens", type=_positive_int, default=32, help="prompt length (default 32)"
    )
    timing.add_argument(
        "--warmup-batches",
        type=_batch_list,
        default=(1, 8, 64),
        help="batch sizes run once after each k is set (default 1,8,64)",
    )
    timing.add_argument(
        "--outlier-factor",
        type=_factor,
        default=1.5,
        help="a cell this many times off its neighbours is re-measured (default 1.5)",
    )
    timing.add_argument(
        "--remeasure-rounds",
        type=_non_negative_int,
        default=1,
        help="extra rounds for such cells (default 1)",
    )
    timing.add_argument("--seed", type=int, default=0, help="prompt token ids (default 0)")
    timing.add_argument(
        "--request-timeout", type=_seconds, default=300.0, help="seconds (default 300)"
    )


def _in_flight_from(args: argparse.Namespace) -> InFlightSettings:
    stream = None
    if (args.prefill_rate is None) != (args.prefill_tokens is None):
        raise InputError("--prefill-rate and --prefill-tokens go together")
    if args.prefill_rate is not None:
        stream = PrefillStream(requests_per_s=args.prefill_rate, prompt_tokens=args.prefill_tokens)
    settings = InFlightSettings(
        window_steps=args.window_steps,
        max_context=args.max_context,
        sync_interval_s=args.sync_interval,
        prefill_stream=stream,
        cross_check=args.cross_check or (),
    )
    room = args.prompt_tokens + 2 * settings.window_steps
    if settings.max_context < room:
        raise InputError(
            f"--max-context {settings.max_context} leaves no room for a window: it must be at "
            f"least --prompt-tokens + 2 x --window-steps = {room}"
        )
    if (stream is not None or settings.cross_check) and args.timing != "in-flight":
        raise InputError("--prefill-rate and --cross-check need --timing in-flight")
    return settings


def settings_from(args: argparse.Namespace) -> ProfilerSettings:
    if args.repeats < 1 or args.decode_tokens < 1 or args.prompt_tokens < 1:
        raise InputError("--repeats, --decode-tokens and --prompt-tokens must be >= 1")
    acceptance = AcceptanceSettings()
    grid = GridSettings()
    in_flight = InFlightSettings()
    method: Literal["in-flight", "request"] = "request"  # the engine check times requests
    if getattr(args, "command", None) == "profile":
        method = "in-flight" if args.timing == "in-flight" else "request"
        in_flight = _in_flight_from(args)
        acceptance = AcceptanceSettings(
            num_prompts=args.acceptance_num_prompts,
            max_tokens=args.acceptance_max_tokens,
            temperature=args.temperature,
            concurrency=args.acceptance_concurrency,
            prompts_path=args.acceptance_prompts,
            synthetic_rates=args.acceptance_synthetic_rates,
            enabled=not args.no_acceptance,
        )
        grid = GridSettings(
            dense_until=args.dense_until, step=args.grid_step, explicit=args.batch_sizes or ()
        )
    return ProfilerSettings(
        grid=grid,
        timing=TimingSettings(
            method=method,
            prompt_tokens=args.prompt_tokens,
            decode_tokens=args.decode_tokens,
            repeats=args.repeats,
            warmup_batches=args.warmup_batches,
            outlier_factor=args.outlier_factor,
            remeasure_rounds=args.remeasure_rounds,
            seed=args.seed,
        ),
        in_flight=in_flight,
        acceptance=acceptance,
        connection=ConnectionSettings(
            request_timeout_s=args.request_timeout,
            admin_token=os.environ.get("TABLETUNE_ADMIN_TOKEN") or None,
        ),
        launch=LaunchSettings(
            python=args.python,
            server_module=args.server_module,
            port=args.port,
            startup_timeout_s=args.startup_timeout,
            extra_args=tuple(shlex.split(args.engine_args)),
        ),
    )


def _stop_on_sigterm() -> None:
    """SIGTERM (a scheduler's or ``timeout``'s stop) takes the Ctrl-C path: partial samples are
    written and the server is stopped, instead of the process dying with vLLM left running."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def _check_profile_flags(args: argparse.Namespace) -> None:
    """What depends on K, checked (and --ks parsed) before vLLM starts."""
    big_k = args.num_speculative_tokens
    if args.ks is not None:
        args.ks = tuple(sorted(parse_k_list(args.ks, flag="--ks")))
        if max(args.ks) > big_k:
            raise InputError(f"--ks: each k must be in 0..K={big_k}, got {list(args.ks)}")
    rates = args.acceptance_synthetic_rates
    if rates is not None and len(rates) != big_k:
        raise InputError(
            f"--acceptance-synthetic-rates: expected K={big_k} rates, got {len(rates)}"
        )
    make_output_folder(Path(args.output), "--output")


def _run_profile(args: argparse.Namespace) -> int:
    _check_profile_flags(args)
    _stop_on_sigterm()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    settings = settings_from(args)
    request = ProfileRequest(
        output=Path(args.output),
        model=args.model,
        drafter=args.drafter,
        method=args.method,
        num_speculative_tokens=args.num_speculative_tokens,
        max_num_seqs=args.max_num_seqs,
        attach_url=args.attach,
        ks=args.ks,
        gpu=args.gpu,
        model_runner=args.model_runner,
        plots=not args.no_plots,
        notes=args.notes,
        engine_log=None if args.engine_log is None else Path(args.engine_log),
    )
    reporter = RichReporter()
    outcome = ProfileRun(request, settings=settings, reporter=reporter).run()
    wall = ", ".join(f"{k} {v:.1f}s" for k, v in outcome.wall_time_s.items())
    reporter.note(f"profile: {outcome.paths.profile} ({len(outcome.profile.cells)} cells); {wall}")
    if outcome.acceptance is not None:
        rates = ", ".join(f"{a:.3f}" for a in outcome.acceptance.rates)
        reporter.note(f"acceptance: a = ({rates}) over {outcome.acceptance.num_drafts} drafts")
    if outcome.solution is not None:
        reporter.note(
            f"table: {[list(r) for r in outcome.solution.ranges]} -> {outcome.paths.table}"
        )
    for note in outcome.notes:
        reporter.note(f"note: {note}")
    return 0


def _run_check(args: argparse.Namespace) -> int:
    _stop_on_sigterm()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    settings = settings_from(args)
    rates = args.rates
    if args.acceptance is not None:
        rates = load_acceptance(args.acceptance).rates[: args.num_speculative_tokens]
    request = CheckRequest(  # a k outside 1..K, or rates not K long, are refused here
        model=args.model,
        drafter=args.drafter,
        method=args.method,
        num_speculative_tokens=args.num_speculative_tokens,
        max_num_seqs=args.max_num_seqs,
        k=args.k,
        batch_sizes=args.batch_sizes,
        threshold=args.threshold,
        rates=rates,
        capture_size=args.capture_size,
    )
    output = Path(args.output)
    beyond = [b for b in request.batch_sizes if b > request.max_num_seqs]
    if beyond:
        raise InputError(f"--batch-sizes: {beyond} above --max-num-seqs {request.max_num_seqs}")
    make_output_folder(output, "--output")
    reporter = RichReporter()
    logs = logs_folder(args.logs)
    reporter.note(f"vLLM logs: {logs}")
    check = EngineCheck(
        request,
        settings=settings,
        reporter=reporter,
        open_arm=launching_arms(settings, logs, reporter),
        read_log=arm_logs(logs),
    )
    result = check.run()
    write_check(result, output)
    for arm, row in result.step_ms.items():
        cells = ", ".join(f"B={b}: {v:.2f} ms" for b, v in row.items())
        reporter.note(f"{arm:>10}: {cells}")
    reporter.note(f"written: {output} (vLLM logs: {logs})")
    return 1 if result.warnings and args.fail_on_warning else 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    profile = subparsers.add_parser(
        "profile",
        help="measure T(B,k) and acceptance on vLLM (one launch), write profile + table",
        description=(
            "Launch vLLM 0.26 with the TableTune plugin (or --attach to one running), set "
            "'k at every batch size' for each k, time every batch size of the grid, measure "
            "acceptance at K, and write the profile, the acceptance, the solver's table and plots."
        ),
    )
    _engine_arguments(profile)
    profile.add_argument("--output", "-o", required=True, help="profile JSON (siblings beside it)")
    profile.add_argument(
        "--attach", metavar="URL", type=_url, help="use a running vLLM with the plugin"
    )
    profile.add_argument(
        "--engine-log",
        type=_readable_file,
        help="with --attach: the server's log, for its CUDA-graph capture sizes (default: "
        "vLLM 0.26's rule for --engine-args)",
    )
    profile.add_argument("--ks", help="draft lengths to profile, e.g. 0,1,3 (default 0..K)")
    profile.add_argument("--gpu", help="GPU name for the metadata (default: nvidia-smi)")
    profile.add_argument("--model-runner", choices=("v1", "v2"), help="for the metadata")
    profile.add_argument(
        "--dense-until", type=_positive_int, default=16, help="every B up to this (default 16)"
    )
    profile.add_argument(
        "--grid-step", type=_positive_int, default=8, help="then every this many (default 8)"
    )
    profile.add_argument(
        "--batch-sizes",
        type=_batch_list,
        help="exactly these batch sizes instead (e.g. 80,81,...,96 to resolve a region densely)",
    )
    method = profile.add_argument_group("in-flight timing (the default method)")
    method.add_argument(
        "--timing",
        choices=("in-flight", "request"),
        default="in-flight",
        help="in-flight: B requests kept decoding, steps read from the plugin's step cells; "
        "request: (t(1+n) - t(1)) / n of whole requests (default in-flight)",
    )
    method.add_argument(
        "--window-steps",
        type=_positive_int,
        default=8,
        help="steps per window, one sample each (default 8)",
    )
    method.add_argument(
        "--max-context",
        type=_positive_int,
        default=256,
        help="requests are replaced before their context passes this (default 256)",
    )
    method.add_argument(
        "--sync-interval",
        type=_seconds,
        default=0.05,
        help="TABLETUNE_SYNC_INTERVAL_S of the launched server (default 0.05)",
    )
    method.add_argument(
        "--cross-check",
        type=_batch_list,
        help="batch sizes also timed by the request method (every k), e.g. 1,8,64,256: the "
        "summary says whether both methods agree",
    )
    method.add_argument(
        "--prefill-rate",
        type=_seconds,
        help="traffic-faithful: one-token requests per second prefilling in the background",
    )
    method.add_argument(
        "--prefill-tokens",
        type=_token_range,
        help="their prompt lengths, LOW-HIGH tokens (drawn uniformly), e.g. 200-1200",
    )
    profile.add_argument(
        "--acceptance-prompts",
        type=_readable_file,
        help="JSONL prompt set (text or token ids); default: the bundled chat prompts when the "
        "server has a tokenizer, else synthetic token ids",
    )
    profile.add_argument(
        "--acceptance-num-prompts", type=_positive_int, default=320, help="(default 320)"
    )
    profile.add_argument(
        "--acceptance-max-tokens", type=_positive_int, default=128, help="(default 128)"
    )
    profile.add_argument(
        "--acceptance-concurrency", type=_positive_int, default=32, help="(default 32)"
    )
    profile.add_argument(
        "--temperature", type=_non_negative, default=0.0, help="serving temperature (default 0)"
    )
    profile.add_argument(
        "--acceptance-synthetic-rates",
        type=_rates,
        help="test mode: measure acceptance under vLLM's synthetic sampler with these a_i",
    )
    profile.add_argument("--no-acceptance", action="store_true")
    profile.add_argument("--no-plots", action="store_true")
    profile.add_argument("--notes", default="", help="free text for the metadata")
    profile.set_defaults(run=_run_profile)

    check = subparsers.add_parser(
        "check",
        help="engine check: each k through a table, the best fixed k without one, k=0 vs no "
        "speculation, the CUDA-graph capture limit (3 launches)",
        description=engine_check.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _engine_arguments(check)
    check.add_argument(
        "--k",
        type=_positive_int,
        help="the fixed k launched without a table (default: the best fixed k measured)",
    )
    rates = check.add_mutually_exclusive_group()
    rates.add_argument(
        "--acceptance", help="acceptance JSON for the best fixed k (tabletune.acceptance)"
    )
    rates.add_argument(
        "--rates", type=_rates, help="a_1..a_K for the best fixed k (default 0.75,0.55,0.40)"
    )
    check.add_argument(
        "--capture-size",
        type=_positive_int,
        help="say what raising compilation_config.max_cudagraph_capture_size to this would "
        "take (graphs, start-up, memory) and which batch sizes it would bring into range",
    )
    check.add_argument(
        "--batch-sizes", type=_batch_list, default=(), help="(default 1, N/4, N: N=max-num-seqs)"
    )
    check.add_argument(
        "--threshold",
        type=_non_negative,
        default=0.03,
        help="a difference above this warns (default 0.03: 3 %%)",
    )
    check.add_argument(
        "--output", "-o", default="engine-check.json", help="(default engine-check.json)"
    )
    check.add_argument(
        "--logs",
        type=Path,
        help="folder for the vLLM logs of the three launches (default: a new temporary folder)",
    )
    check.add_argument("--fail-on-warning", action="store_true", help="exit 1 on a warning")
    check.set_defaults(run=_run_check)
