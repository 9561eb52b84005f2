"""``tabletune`` entry point: every subcommand is always listed, and registered by its part.

Each part's CLI module exposes ``register(subparsers)``. It is imported only when its extra is
installed; without it, the part's commands still exist and answer one line naming the extra to
install (exit 2), whatever follows them. So ``pip install tabletune`` (solve, compare) needs no
daemon, emulator, profiler or vLLM, and still tells what ``tabletune sim list`` would need.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from tabletune import __version__
from tabletune.errors import TableTuneError


@dataclass(frozen=True)
class Part:
    """A CLI module, the commands it registers, and the extra its dependencies come from."""

    module: str
    commands: tuple[str, ...]
    extra: str | None
    """None: the core install (a failed import is then a bug, not a missing extra)"""


PARTS: tuple[Part, ...] = (
    Part("tabletune.cli.solve", ("solve",), None),
    Part("tabletune.cli.compare", ("compare",), None),
    Part("tabletune.profiler.cli", ("profile", "check"), "profiler"),
    Part("tabletune.sim.cli", ("sim",), "sim"),
    Part("tabletune.daemon.cli", ("daemon",), "daemon"),
    Part("tabletune.demo.cli", ("demo",), "demo"),
)


@dataclass(frozen=True)
class MissingExtra:
    command: str
    module: str
    extra: str

    def message(self) -> str:
        return (
            f"tabletune {self.command}: needs the [{self.extra}] extra ({self.module} is not "
            f"installed): pip install 'tabletune[{self.extra}]'"
        )


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (the usage stays in ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="tabletune",
        description="Measure, compute and keep right vLLM's batch-size -> draft-length table.",
    )
    parser.add_argument("--version", action="version", version=f"tabletune {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for part in PARTS:
        try:
            module = importlib.import_module(part.module)
        except ModuleNotFoundError as error:
            if part.extra is None or (error.name or "tabletune").startswith("tabletune"):
                raise
            for command in part.commands:
                stub = subparsers.add_parser(
                    command, help=f"(needs: pip install 'tabletune[{part.extra}]')", add_help=False
                )
                stub.set_defaults(missing=MissingExtra(command, error.name or "?", part.extra))
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (`tabletune sim list | head -1`). The Python docs' recipe: point stdout
        # at devnull so the interpreter's own flush at exit does not fail a second time.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    missing: MissingExtra | None = getattr(args, "missing", None)
    if missing is not None:  # before anything else: whatever followed, the extra is the answer
        print(missing.message(), file=sys.stderr)
        return 2
    if unknown:
        where = f"tabletune {args.command}" if args.command else "tabletune"
        print(
            f"{where}: error: unrecognized arguments: {' '.join(unknown)} (see '{where} --help')",
            file=sys.stderr,
        )
        return 2
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        result: int = args.run(args)
    except TableTuneError as error:
        print(f"tabletune: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        if error.filename is None:
            raise  # not a path the user gave (a broken pipe, a socket): not an input error
        # e.g. --output, --plot or --json-out into a folder that does not exist
        print(f"tabletune: error: {error.filename}: {error.strerror}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tabletune: interrupted", file=sys.stderr)
        return 130
    return result


if __name__ == "__main__":
    sys.exit(main())
