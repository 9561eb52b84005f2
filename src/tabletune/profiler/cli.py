"""``tabletune profile`` and ``tabletune check`` (registered by ``tabletune.cli.main``)."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
from pathlib import Path

from tabletune.errors import InputError
from tabletune.profiler.check import CheckRequest, EngineCheck, launching_arms, write_check
from tabletune.profiler.progress import RichReporter
from tabletune.profiler.run import ProfileRequest, ProfileRun
from tabletune.profiler.settings import (
    AcceptanceSettings,
    ConnectionSettings,
    GridSettings,
    LaunchSettings,
    ProfilerSettings,
    TimingSettings,
)


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


def _engine_arguments(parser: argparse.ArgumentParser) -> None:
    engine = parser.add_argument_group("engine")
    engine.add_argument("--model", required=True, help="target model (path or name)")
    engine.add_argument("--drafter", help="draft model (path or name)")
    engine.add_argument("--method", default="eagle3", help="speculative method (default eagle3)")
    engine.add_argument(
        "--num-speculative-tokens", "-K", type=int, required=True, help="K, the longest k"
    )
    engine.add_argument("--max-num-seqs", type=int, required=True)
    engine.add_argument(
        "--engine-args",
        default="",
        help="extra vLLM arguments, one string (e.g. '--load-format dummy --skip-tokenizer-init')",
    )
    engine.add_argument("--python", default=sys.executable, help="Python that has vLLM")
    engine.add_argument(
        "--server-module",
        default=LaunchSettings.server_module,
        help="module run as the server (default vLLM's OpenAI server)",
    )
    engine.add_argument("--port", type=int, default=0, help="0: a free port")
    engine.add_argument("--startup-timeout", type=float, default=900.0, help="seconds")
    timing = parser.add_argument_group("timing")
    timing.add_argument("--repeats", type=int, default=3)
    timing.add_argument("--decode-tokens", type=int, default=64)
    timing.add_argument("--prompt-tokens", type=int, default=32)
    timing.add_argument("--warmup-batches", type=_ints, default=(1, 8, 64))
    timing.add_argument("--outlier-factor", type=float, default=1.5)
    timing.add_argument("--remeasure-rounds", type=int, default=1)
    timing.add_argument("--seed", type=int, default=0)
    timing.add_argument("--request-timeout", type=float, default=300.0, help="seconds")


def settings_from(args: argparse.Namespace) -> ProfilerSettings:
    if args.repeats < 1 or args.decode_tokens < 1 or args.prompt_tokens < 1:
        raise InputError("--repeats, --decode-tokens and --prompt-tokens must be >= 1")
    acceptance = AcceptanceSettings()
    grid = GridSettings()
    if getattr(args, "command", None) == "profile":
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
            prompt_tokens=args.prompt_tokens,
            decode_tokens=args.decode_tokens,
            repeats=args.repeats,
            warmup_batches=args.warmup_batches,
            outlier_factor=args.outlier_factor,
            remeasure_rounds=args.remeasure_rounds,
            seed=args.seed,
        ),
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


def _run_profile(args: argparse.Namespace) -> int:
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
    request = CheckRequest(
        model=args.model,
        drafter=args.drafter,
        method=args.method,
        num_speculative_tokens=args.num_speculative_tokens,
        max_num_seqs=args.max_num_seqs,
        k=args.k,
        batch_sizes=args.batch_sizes,
        threshold=args.threshold,
    )
    reporter = RichReporter()
    output = Path(args.output)
    check = EngineCheck(
        request,
        settings=settings,
        reporter=reporter,
        open_arm=launching_arms(settings, output.with_suffix(".logs"), reporter),
    )
    result = check.run()
    write_check(result, output)
    for arm, row in result.step_ms.items():
        cells = ", ".join(f"B={b}: {v:.2f} ms" for b, v in row.items())
        reporter.note(f"{arm:>9}: {cells}")
    reporter.note(f"written: {output}")
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
    profile.add_argument("--attach", metavar="URL", help="use a running vLLM with the plugin")
    profile.add_argument("--ks", type=_ints, help="draft lengths to profile (default 0..K)")
    profile.add_argument("--gpu", help="GPU name for the metadata (default: nvidia-smi)")
    profile.add_argument("--model-runner", choices=("v1", "v2"), help="for the metadata")
    profile.add_argument("--dense-until", type=int, default=16, help="every B up to this")
    profile.add_argument("--grid-step", type=int, default=8, help="then every this many")
    profile.add_argument(
        "--batch-sizes",
        type=_ints,
        help="exactly these batch sizes instead (e.g. 80,81,...,96 to resolve a region densely)",
    )
    profile.add_argument("--acceptance-prompts", help="JSONL prompt set (text or token ids)")
    profile.add_argument("--acceptance-num-prompts", type=int, default=160)
    profile.add_argument("--acceptance-max-tokens", type=int, default=128)
    profile.add_argument("--acceptance-concurrency", type=int, default=32)
    profile.add_argument("--temperature", type=float, default=0.0, help="serving temperature")
    profile.add_argument(
        "--acceptance-synthetic-rates",
        type=_floats,
        help="test mode: measure acceptance under vLLM's synthetic sampler with these a_i",
    )
    profile.add_argument("--no-acceptance", action="store_true")
    profile.add_argument("--no-plots", action="store_true")
    profile.add_argument("--notes", default="", help="free text for the metadata")
    profile.set_defaults(run=_run_profile)

    check = subparsers.add_parser(
        "check",
        help="engine check: fixed k with/without a table, k=0 vs no speculation (3 launches)",
    )
    _engine_arguments(check)
    check.add_argument("--k", type=int, help="the fixed k to compare (default K)")
    check.add_argument("--batch-sizes", type=_ints, default=(), help="default 1,N/4,N")
    check.add_argument("--threshold", type=float, default=0.03, help="difference that warns")
    check.add_argument("--output", "-o", default="engine-check.json")
    check.add_argument("--fail-on-warning", action="store_true", help="exit 1 on a warning")
    check.set_defaults(run=_run_check)
