"""Loading what the commands need, with errors that name the file or argument, and the table
problem solve/compare build from the same options."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from tabletune.errors import InputError
from tabletune.schemas import Profile, load_acceptance, load_profile
from tabletune.schemas.profile import step_times_of, uncertainty_of
from tabletune.solver import (
    DEFAULT_CONFIDENCE,
    DEFAULT_STICKINESS,
    SolverError,
    StepTimes,
    TableProblem,
)


@dataclass(frozen=True)
class Inputs:
    profile: Profile
    step_times: StepTimes
    rates: tuple[float, ...]
    rates_source: str
    max_batch: int


def parse_k_list(text: str, flag: str = "--allowed-k") -> frozenset[int]:
    """``"0,1,3"`` -> {0, 1, 3}; empty or negative is refused (``flag`` names the argument)."""
    try:
        values = frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InputError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise InputError(f"{flag}: expected non-negative integers, got {text!r}")
    return values


def number_type(
    kind: Callable[[str], int | float], ok: Callable[[float], bool], expected: str
) -> Callable[[str], int | float]:
    """An argparse ``type``: ``kind(text)`` that must satisfy ``ok``, else a one-line error
    saying ``expected`` (NaN never satisfies it)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value != value or not ok(value):  # value != value: NaN
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


def make_output_folder(output: Path, flag: str) -> None:
    """Make the folder an output file goes into, before any work (a bad path is then one line
    at once, not a traceback at the end of a run)."""
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        reason = error.strerror or str(error)
        raise InputError(f"{flag}: cannot make the folder {output.parent}: {reason}") from None


def load_inputs(profile_path: str, acceptance_path: str | None, max_batch: int | None) -> Inputs:
    profile = load_profile(profile_path)
    if acceptance_path is not None:
        acceptance = load_acceptance(acceptance_path)
        source = acceptance_path
    elif profile.acceptance is not None:
        acceptance = profile.acceptance
        source = f"{profile_path} (embedded acceptance)"
    else:
        raise InputError(f"{profile_path}: holds no acceptance; give one with --acceptance FILE")
    if acceptance.max_k < profile.ks[-1]:
        raise InputError(
            f"{source}: rates cover k<={acceptance.max_k} but the profile has k={profile.ks[-1]}"
        )
    grid_max = profile.batch_grid[-1]
    if max_batch is None:
        max_batch = grid_max
    elif not 1 <= max_batch <= grid_max:
        raise InputError(f"--max-batch: {max_batch} is outside the profiled 1..{grid_max}")
    return Inputs(
        profile=profile,
        step_times=step_times_of(profile),
        rates=acceptance.rates,
        rates_source=source,
        max_batch=max_batch,
    )


def add_table_options(parser: argparse.ArgumentParser) -> None:
    """How the table is built from the profile (solve and compare share them)."""
    parser.add_argument(
        "--stickiness",
        type=float,
        default=DEFAULT_STICKINESS,
        help="keep the previous k unless another is better by more than this (default 0.005)",
    )
    parser.add_argument(
        "--confidence",
        type=float,
        default=DEFAULT_CONFIDENCE,
        help=(
            "z: change k only where the predicted gain exceeds z sigma of the profile's "
            "measurement spread (default 1; 0 = ignore the spread)"
        ),
    )
    parser.add_argument(
        "--min-width",
        type=int,
        default=1,
        help=(
            "no range narrower than N batch sizes (default 1; with the plugin's hysteresis h, "
            "2h+1 keeps every range reachable)"
        ),
    )


def table_problem(
    inputs: Inputs, args: argparse.Namespace, allowed_k: Collection[int] | None = None
) -> TableProblem:
    """The solver's problem for these inputs and ``add_table_options``' options."""
    try:
        return TableProblem(
            step_times=inputs.step_times,
            rates=inputs.rates,
            allowed_k=inputs.step_times.ks if allowed_k is None else allowed_k,
            max_batch=inputs.max_batch,
            stickiness=args.stickiness,
            uncertainty=uncertainty_of(inputs.profile, inputs.max_batch),
            confidence=args.confidence,
            min_width=args.min_width,
        )
    except SolverError as error:
        raise InputError(str(error)) from None
