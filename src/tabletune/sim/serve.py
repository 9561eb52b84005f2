"""Serving: one process, one event loop, one app, one listening socket per replica.

Every replica gets its own port because that is what a real deployment looks like: each vLLM
server is its own scrape target (Prometheus adds ``instance``) and its own admin endpoint, so
the daemon's discovery, per-target scrape failures and per-engine pushes are exercised as they
will run. Labels inside one target would hide all of that.
"""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import uvicorn

from tabletune.admin.auth import AdminAuth
from tabletune.errors import InputError
from tabletune.schemas import Profile
from tabletune.sim.app import ReplicaSet, build_app
from tabletune.sim.replica import Replica, SimClock
from tabletune.sim.scenario import Scenario

MAX_REPLICAS = 5000


def parse_ports(port: int | None, ports: str | None) -> list[int]:
    """``--port N`` or ``--ports A-B`` (inclusive) -> the list of ports."""
    if ports is None:
        return [8000 if port is None else port]
    if port is not None:
        raise InputError("give --port or --ports, not both")
    low, sep, high = ports.partition("-")
    try:
        first, last = int(low), int(high if sep else low)
    except ValueError:
        raise InputError(f"--ports {ports!r}: expected A-B, e.g. 9000-9999") from None
    if not 0 < first <= last < 65536:
        raise InputError(f"--ports {ports!r}: need 0 < A <= B < 65536")
    if last - first + 1 > MAX_REPLICAS:
        raise InputError(f"--ports {ports!r}: at most {MAX_REPLICAS} replicas")
    return list(range(first, last + 1))


def raise_file_limit(needed: int) -> None:
    """Each port is a socket and each scrape a connection: lift the soft fd limit if needed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def bind_sockets(host: str, ports: Sequence[int]) -> list[socket.socket]:
    raise_file_limit(3 * len(ports) + 256)
    sockets: list[socket.socket] = []
    try:
        for port in ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as error:
                sock.close()
                raise InputError(f"cannot listen on {host}:{port}: {error.strerror}") from None
            sock.set_inheritable(True)
            sockets.append(sock)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def build_replicas(
    scenario: Scenario,
    profile: Profile,
    *,
    base_dir: Path,
    ports: Sequence[int],
    speed: float,
    wall: Callable[[], float] = time.time,
) -> ReplicaSet:
    """One replica per port, on one shared clock; replica i draws with seed ``seed + i``."""
    clock = SimClock(speed=speed, start_wall=wall(), wall=wall)
    return ReplicaSet(
        {
            port: Replica(scenario, profile, base_dir=base_dir, clock=clock, index=index)
            for index, port in enumerate(ports)
        }
    )


def serve(replicas: ReplicaSet, sockets: list[socket.socket], *, auth: AdminAuth) -> None:
    """Run until SIGINT/SIGTERM (uvicorn handles both and closes the sockets)."""
    app = build_app(replicas, auth=auth)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        backlog=256,
        timeout_keep_alive=30,
    )
    uvicorn.Server(config).run(sockets=sockets)
