"""``tabletune`` entry point: subcommands are registered by the part that owns them.

Each module below exposes ``register(subparsers)``; it is imported lazily only when present and
its dependencies are installed, so the core install (solve/compare) needs no daemon or vLLM.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from tabletune import __version__
from tabletune.errors import TableTuneError

# (module, the extra that provides its dependencies)
SUBCOMMAND_MODULES: tuple[tuple[str, str], ...] = (
    ("tabletune.cli.solve", "core"),
    ("tabletune.cli.compare", "plot"),
    ("tabletune.profiler.cli", "profiler"),
    ("tabletune.sim.cli", "sim"),
    ("tabletune.daemon.cli", "daemon"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tabletune",
        description="Measure, compute and keep right vLLM's batch-size -> draft-length table.",
    )
    parser.add_argument("--version", action="version", version=f"tabletune {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name, extra in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name and error.name.startswith("tabletune."):
                continue  # that part is not built yet
            missing = error.name
            stub = subparsers.add_parser(module_name.split(".")[-2], help=f"(needs [{extra}])")
            stub.set_defaults(missing=(missing, extra))
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "missing", None):
        name, extra = args.missing
        print(
            f"tabletune: this command needs {name}; "
            f"install it with: pip install 'tabletune[{extra}]'",
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
    except KeyboardInterrupt:
        print("tabletune: interrupted", file=sys.stderr)
        return 130
    return result


if __name__ == "__main__":
    sys.exit(main())
