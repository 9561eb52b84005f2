"""``tabletune sim``: serve emulated engines, list and check scenarios."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from tabletune.admin.auth import OPEN_ENV, TOKEN_ENV, AdminAuth, auth_from_env
from tabletune.cli.inputs import number_type
from tabletune.sim.build import resolve_profile, usable_step_times
from tabletune.sim.scenario import Scenario, load_scenario, packaged_names

_port = number_type(int, lambda v: 0 < v < 65536, "a port in 1..65535")
_speed = number_type(float, lambda v: 0 < v < float("inf"), "a finite number > 0")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sim", help="engine emulator: a vLLM-with-plugin look-alike for tests and demos"
    )
    commands = parser.add_subparsers(dest="sim_command", metavar="SIM_COMMAND")

    serve = commands.add_parser(
        "serve",
        help="serve /metrics, the admin API and /sim/v1/* for one or many engines",
        description=(
            "The admin API follows the plugin's rules and variables: TABLETUNE_ADMIN_TOKEN (or "
            f"the scenario's admin_token), TABLETUNE_ADMIN_TOKEN_FILE, {OPEN_ENV}=loopback."
        ),
    )
    serve.add_argument("--scenario", required=True, help="scenario file, or a packaged name")
    serve.add_argument("--profile", help="profile JSON (default: the scenario's)")
    where = serve.add_mutually_exclusive_group()
    where.add_argument("--port", type=_port, help="one engine on this port (default 8000)")
    where.add_argument("--ports", help="one engine per port, A-B inclusive (e.g. 9000-9999)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument(
        "--speed", type=_speed, default=1.0, help="simulated seconds per wall second (default 1)"
    )
    serve.set_defaults(run=run_serve)

    listing = commands.add_parser("list", help="list the packaged scenarios")
    listing.set_defaults(run=run_list)

    check = commands.add_parser("check", help="validate a scenario (and its profile)")
    check.add_argument("--scenario", required=True)
    check.add_argument("--profile")
    check.set_defaults(run=run_check)

    parser.set_defaults(run=lambda args: (parser.print_help(), 2)[1])


def run_serve(args: argparse.Namespace) -> int:
    from tabletune.sim.serve import bind_sockets, build_replicas, parse_ports, serve

    scenario, base_dir = load_scenario(args.scenario)
    profile = resolve_profile(scenario, base_dir, args.profile)
    usable_step_times(scenario, profile)
    ports = parse_ports(args.port, args.ports)
    sockets = bind_sockets(args.host, ports)
    replicas = build_replicas(scenario, profile, base_dir=base_dir, ports=ports, speed=args.speed)
    span = f"{ports[0]}" if len(ports) == 1 else f"{ports[0]}-{ports[-1]}"
    print(
        f"tabletune sim: scenario {scenario.name!r}, {len(ports)} engine(s) on "
        f"{args.host}:{span}, speed x{args.speed:g}",
        flush=True,
    )
    auth = admin_auth(scenario, os.environ)
    print(f"tabletune sim: admin API: {auth.describe()}", flush=True)
    serve(replicas, sockets, auth=auth)
    return 0


def admin_auth(scenario: Scenario, env: Mapping[str, str]) -> AdminAuth:
    """The plugin's rules from the same variables; the scenario's ``admin_token`` stands for
    the emulated engine's TABLETUNE_ADMIN_TOKEN."""
    token = scenario.engine.admin_token
    return auth_from_env({**env, TOKEN_ENV: token} if token is not None else env)


def run_list(args: argparse.Namespace) -> int:
    for name in packaged_names():
        scenario, _ = load_scenario(name)
        print(f"{name:24s} {scenario.description.splitlines()[0] if scenario.description else ''}")
    return 0


def run_check(args: argparse.Namespace) -> int:
    scenario, base_dir = load_scenario(args.scenario)
    if args.profile is not None or scenario.profile is not None:
        usable_step_times(scenario, resolve_profile(scenario, base_dir, args.profile))
    print(f"{args.scenario}: ok ({scenario.name})")
    return 0
