"""Every way of choosing k under users' traffic shapes, at several loads, in ONE launch of real
vLLM 0.26 (+ the TableTune plugin): ``DRIVER=bench/gpu/eval_traffic.py
REPORT=bench/gpu/eval_traffic_report.py bash bench/gpu/live_step_time.sh`` (eval_traffic.sh).

Closed-loop clients send requests whose lengths come from a named shape (traffic.py; chat-like by
default: prompts lognormal around 600 tokens, outputs around 250; contexts spread from the start).
For each load (a number of clients, in the order given), in turn:

  warm-up   the load's clients start (the previous load's drained first)
  daemon    the documented table shrunk to a quarter put in, then ``tabletune daemon`` (direct
            scrape, live step time, the measured profile as its prior) for DAEMON_S seconds:
            windows of tokens/s (its convergence); then stopped, its last table kept as the
            ``daemon`` arm (its steady state, without the exploration it did meanwhile)
  arms      k0 (no drafting), k1..k3 fixed, vLLM's documented table, the measured table (the
            profile's), the daemon's table (--arms picks): ROUNDS windows each, in pairs of
            rounds, one order then its reverse (``rotations``), so no arm keeps a place.
            With ``--rounds-per-block N`` (even) consecutive rounds form interleaved blocks
            (each window records its ``round`` and ``block``): every arm in the same seconds,
            so a stall of the engine hits all of them alike (eval_traffic_paired.py).
            ``nightjar`` (not in the default --arms): the Nightjar-style bandit run in the
            engine (admin setting ``policy: nightjar``), switched on fresh before each of its
            windows, left NIGHTJAR_LEARN_S to learn, measured, then switched off. In a run of
            blocks it is not in the rotation (a fresh bandit's learning does not fit a short
            visit): once per load, after it, fresh, NIGHTJAR_LEARN_S to learn, then windows
            for NIGHTJAR_S (part ``<load>-nightjar``), its loss read from the k its steps ran

Then, with ``--shape-change BEFORE:AFTER:N``, a change of traffic under the daemon:

  change    N clients of BEFORE traffic, the daemon from the quarter table for CHANGE_BEFORE_S,
            then the clients switched to AFTER (the old requests abandoned) with the daemon
            still running for CHANGE_AFTER_S: windows throughout; then fixed k=0..3, the table
            in force at the change (``before``) and the daemon's last (``after``), rotated

Every window is a raw row as in live_step_time.py (vLLM's counter increases, the plugin's step
cells, the mean number of running requests = the effective B, the view). The JSON is rewritten
after every part; a load whose planned rounds no longer fit the budget runs as many whole pairs
of rounds (whole blocks) as fit (``rounds``: planned vs run per part), and is skipped (recorded)
only when not even one fits.
eval_traffic_report.py turns it into bench/results/eval_traffic_<shape>_<gpu>.json and a PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path

from live_daemon import Run as DaemonRun  # this script's folder is first on sys.path
from live_daemon import daemon_meta
from live_step_time import (
    SETTINGS_PATH,
    STATIC,
    Row,
    add_job_arguments,
    empty_result,
    wait_started,
)
from traffic import SHAPES, add_traffic_arguments, checked_shape

from tabletune.schemas import DOCUMENTED_EAGLE_TABLE

PROFILE = "profiles/h200-{model}-eagle3-inflight"  # the fast profiler's for --model, H200
ARMS = ("k0", "k1", "k2", "k3", "documented", "measured", "daemon")  # the default --arms
NIGHTJAR = "nightjar"
KNOWN_ARMS = (*ARMS, NIGHTJAR)
QUARTER_DOCUMENTED = [[1, 16, 3], [17, 32, 1], [33, 256, 0]]
# The time estimate's allowances beyond the windows themselves (H200 launch 2026-11-30: the
# windows' wall_s ran 0.05-0.13 s over window_s; the load drained in about 3 s).
WINDOW_OVERHEAD_S = 0.25  # a window's scrapes and view, the table PUT before it
DAEMON_STOP_S = 3.0  # SIGTERM to the daemon and its last table read
DRAIN_S = 10.0  # the load's requests in flight finishing


def rounds_that_fit(
    planned: int, needs_s: Callable[[int], float], left_s: float, unit: int = 2
) -> int:
    """``planned`` rounds when they fit in ``left_s``, else the most whole units of rounds that
    do (a pair, or a block of pairs, keeps the rotation's balance), else 0: not one unit fits."""
    if needs_s(planned) <= left_s:
        return planned
    for rounds in range((planned - 1) // unit * unit, 0, -unit):
        if needs_s(rounds) <= left_s:
            return rounds
    return 0


def zigzag(n: int) -> list[int]:
    """0, 1, n-1, 2, n-2, ...: a Williams design's first row. Its neighbours are 1, 2, 3 ...
    places apart in turn, each distance once for an even n; an odd n needs the reverse too
    (``rotations`` pairs every order with its reverse)."""
    low, high, out = 1, n - 1, [0]
    while len(out) < n:
        out.append(low)
        low += 1
        if len(out) < n:
            out.append(high)
            high -= 1
    return out


def rotations(arms: list[str], rounds: int) -> list[str]:
    """Rounds in pairs: pair p is ``arms`` in a zigzag from place p (A B D C, then B C A D ...
    for four), then the same reversed. Over each pair every arm's mean place is the same, so
    a drift in the machine favours none; over len(arms) pairs every arm comes right after
    every other exactly twice (a window carries some of the arm before it: the closed loop
    settles into a new k's mix over seconds), where a plain rotation put each arm only ever
    after the two beside it in the list."""
    n, steps, out = len(arms), zigzag(len(arms)), []
    for r in range(rounds):
        order = [arms[(r // 2 + step) % n] for step in steps]
        out.extend(reversed(order) if r % 2 else order)
    return out


def visits(arms: list[str], rounds: int, rounds_per_block: int) -> list[Row]:
    """The rotation's windows in order, each with its arm, its place (``index``), its round
    and its block (``rounds_per_block`` consecutive rounds: whole pairs when more than one, so
    every arm's mean place within a block is the same and a stall inside it favours none)."""
    return [
        {"arm": arm, "index": index, "round": index // len(arms),
         "block": index // len(arms) // rounds_per_block}
        for index, arm in enumerate(rotations(arms, rounds))
    ]  # fmt: skip


def block_unit(rounds_per_block: int) -> int:
    """The rounds a load runs a whole number of: pairs, or blocks of pairs."""
    return max(2, rounds_per_block)


def documented_table(max_num_seqs: int) -> list[list[int]]:
    """vLLM's documented EAGLE table, cut at the engine's max_num_seqs."""
    return [
        [start, min(end, max_num_seqs), k]
        for start, end, k in DOCUMENTED_EAGLE_TABLE
        if start <= max_num_seqs
    ]


def read_table(path: str) -> list[list[int]]:
    """The ranges of a table file as ``tabletune solve`` writes it ({"ranges": [...]})."""
    return [list(r) for r in json.loads(Path(path).read_text())["ranges"]]


class Run(DaemonRun):
    """The loads in turn; the arms' tables are fixed except the daemon's, set per load."""

    @cached_property
    def measured_table(self) -> list[list[int]]:
        return read_table(self.args.measured_table)

    def arm_tables(self, daemon_table: list[list[int]]) -> dict[str, list[list[int]]]:
        every = {
            **{f"k{k}": self.fixed_table(k) for k in range(4)},
            "documented": documented_table(self.args.max_num_seqs),
            "measured": self.measured_table,
            "daemon": daemon_table,
            NIGHTJAR: self.measured_table,  # in force under the bandit, not run by it
        }
        return {arm: every[arm] for arm in self.args.arms.split(",")}

    async def one_load(self, part: str, shape: str, clients: int, rounds: int) -> None:
        load = self.closed_loop(seed=clients, shape=SHAPES[shape], clients=clients)
        try:
            await asyncio.sleep(self.args.warmup_s)
            start = json.loads(self.args.start_table)
            daemon_table = await self.run_daemon(f"{part}-daemon", start, self.args.daemon_s)
            self.result.setdefault("daemon_tables", {})[part] = daemon_table
            self.save()
            tables = self.arm_tables(daemon_table)
            apart = self.args.rounds_per_block > 1 and NIGHTJAR in tables
            await self.rotate(part, {a: t for a, t in tables.items()
                                     if not (apart and a == NIGHTJAR)}, rounds)  # fmt: skip
            if apart:
                await self.nightjar_run(part)
        finally:
            await load.drain()

    async def nightjar_run(self, part: str) -> None:
        """In a run of blocks: a fresh bandit from the measured table, NIGHTJAR_LEARN_S to
        learn, then windows for NIGHTJAR_S; back to the table whatever happened."""
        await self.put_table(self.measured_table)
        on = {"policy": NIGHTJAR, "nightjar_exploration": self.args.nightjar_exploration}
        await self.server.put(SETTINGS_PATH, on)
        try:
            await asyncio.sleep(self.args.nightjar_learn_s + self.args.settle_s)
            for index in range(self.nightjar_windows()):
                await self.window(f"{part}-nightjar", NIGHTJAR, index, self.args.window_s)
        finally:
            await self.server.put(SETTINGS_PATH, {"policy": "table"})

    def nightjar_windows(self) -> int:
        return math.ceil(self.args.nightjar_s / self.args.window_s)

    async def shape_change(self, before: str, after: str, clients: int, rounds: int) -> None:
        """The daemon under ``before`` traffic for CHANGE_BEFORE_S, then the traffic switched
        to ``after`` under it for CHANGE_AFTER_S (windows throughout); then ``change_tables``
        rotated on ``after``."""
        part = change_part(before, after, clients)
        loads = [self.closed_loop(seed=clients, shape=SHAPES[before], clients=clients)]
        record: Row = {"part": part, "before": before, "after": after, "clients": clients}
        self.result["shape_change"] = record

        async def switch() -> None:
            record["table_at_change"] = (await self.server.view())["table"]
            record["at_s"] = self.args.change_before_s
            await loads[0].stop()
            loads.append(self.closed_loop(seed=clients + 1, shape=SHAPES[after], clients=clients))

        try:
            await asyncio.sleep(self.args.warmup_s)
            start = json.loads(self.args.start_table)
            seconds = self.args.change_before_s + self.args.change_after_s
            event = (self.args.change_before_s, switch)
            final = await self.run_daemon(f"{part}-daemon", start, seconds, event=event)
            record["daemon_table"] = final
            self.save()
            await self.rotate(part, self.change_tables(record["table_at_change"], final), rounds)
        finally:
            await loads[-1].drain()

    def change_tables(self, before: list[list[int]], after: list[list[int]]
                      ) -> dict[str, list[list[int]]]:  # fmt: skip
        """The arms rotated on the new traffic: every fixed k (k0 too: the daemon's bursts
        run it, and a k no arm ran is priced lost whole), the table at the change, the last."""
        return {**{f"k{k}": self.fixed_table(k) for k in range(4)},
                "before": before, "after": after}  # fmt: skip

    def change_needs_s(self, rounds: int) -> float:
        arms = len(self.change_tables([], []))
        return self.needs_s(arms, self.args.change_before_s + self.args.change_after_s, rounds)

    def load_needs_s(self, rounds: int) -> float:
        args = self.args
        arms = args.arms.split(",")
        if NIGHTJAR in arms and args.rounds_per_block > 1:  # once, after the rotation
            run = (args.nightjar_learn_s + args.settle_s
                   + self.nightjar_windows() * (args.window_s + WINDOW_OVERHEAD_S))  # fmt: skip
            return self.needs_s(len(arms) - 1, args.daemon_s, rounds) + run
        learning = rounds * args.nightjar_learn_s if NIGHTJAR in arms else 0.0
        return self.needs_s(len(arms), args.daemon_s, rounds) + learning

    def needs_s(self, arms: int, daemon_s: float, rounds: int) -> float:
        """A part's time: warm-up, the daemon's windows (they run until daemon_s has passed),
        the rotated arms' windows after their settle, the drain."""
        args = self.args
        daemon = math.ceil(daemon_s / args.window_s) * (args.window_s + WINDOW_OVERHEAD_S)
        windows = arms * rounds * (args.window_s + args.settle_s + WINDOW_OVERHEAD_S)
        return args.warmup_s + daemon + DAEMON_STOP_S + windows + DRAIN_S

    async def fitted_part(self, name: str, needs_s: Callable[[int], float],
                          body: Callable[[int], Awaitable[None]],
                          reserve_s: float = 0.0) -> None:  # fmt: skip
        """A part with as many of the planned rounds as fit what is left (whole pairs, or
        whole blocks), so a slow engine start shortens a load instead of skipping it; rounds
        planned vs run are recorded (run 0: skipped, not even one pair or block fitted).
        ``reserve_s``: time kept back for a later part (the shape change's smallest run)."""
        planned, unit = self.args.rounds, block_unit(self.args.rounds_per_block)
        rounds = rounds_that_fit(planned, needs_s, self.left_s() - reserve_s, unit)
        self.result.setdefault("rounds", {})[name] = {"planned": planned, "run": rounds}
        # Not one unit fits beside the reserve: recorded as skipped with what it would need.
        needed = needs_s(rounds) if rounds else needs_s(min(planned, unit)) + reserve_s
        await self.part(name, needed, lambda: body(rounds))

    async def rotate(self, part: str, tables: dict[str, list[list[int]]], rounds: int) -> None:
        """The arms' tables in rotated rounds, one window each (its round and block recorded),
        exploration off."""
        await self.server.put(SETTINGS_PATH, STATIC)
        for visit in visits(list(tables), rounds, self.args.rounds_per_block):
            await self.put_table(tables[visit["arm"]])
            if visit["arm"] == NIGHTJAR:
                await self.nightjar_window(part, visit)
                continue
            await asyncio.sleep(self.args.settle_s)
            await self.visit_window(part, visit)

    async def visit_window(self, part: str, visit: Row) -> None:
        arm, index = visit["arm"], visit["index"]
        places = {"round": visit["round"], "block": visit["block"]}
        await self.window(f"{part}-arms", arm, index, self.args.window_s, **places)

    async def nightjar_window(self, part: str, visit: Row) -> None:
        """A fresh bandit (switched on from the table), NIGHTJAR_LEARN_S to learn, one window;
        back to the table whatever happened."""
        on = {"policy": NIGHTJAR, "nightjar_exploration": self.args.nightjar_exploration}
        await self.server.put(SETTINGS_PATH, on)
        try:
            await asyncio.sleep(self.args.nightjar_learn_s + self.args.settle_s)
            await self.visit_window(part, visit)
        finally:
            await self.server.put(SETTINGS_PATH, {"policy": "table"})


def parse_loads(text: str, default_shape: str) -> list[tuple[str, int]]:
    """``128,decode-heavy:192`` -> [(default_shape, 128), ("decode-heavy", 192)]; ``none``:
    no load (a launch for the shape change alone)."""
    if text == "none":
        return []
    loads = []
    for item in text.split(","):
        shape, _, clients = item.rpartition(":")
        shape = shape or default_shape
        if shape not in SHAPES or not clients.isdigit() or int(clients) < 1:
            raise ValueError(f"load {item!r}: N or SHAPE:N, SHAPE one of {sorted(SHAPES)}")
        loads.append((shape, int(clients)))
    return loads


def part_name(shape: str, clients: int) -> str:
    return f"{shape}-B{clients}"


def change_part(before: str, after: str, clients: int) -> str:
    return f"change-{before}-{after}-B{clients}"


def parse_change(text: str) -> tuple[str, str, int]:
    """``decode-heavy:chat-like:192`` -> ("decode-heavy", "chat-like", 192)."""
    parts = text.split(":")
    if (len(parts) != 3 or parts[0] not in SHAPES or parts[1] not in SHAPES
            or parts[0] == parts[1] or not parts[2].isdigit() or int(parts[2]) < 1):  # fmt: skip
        raise ValueError(f"shape change {text!r}: BEFORE:AFTER:N, two shapes of {sorted(SHAPES)}")
    return parts[0], parts[1], int(parts[2])


async def run(args: argparse.Namespace) -> int:
    loads = parse_loads(args.loads, args.shape)
    shapes = sorted(
        {s for s, _ in loads}
        | set(parse_change(args.shape_change)[:2] if args.shape_change else ())
    )
    result = empty_result(
        {
            "what": "every way of choosing k under one traffic shape, several loads, one launch",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            **json.loads(args.meta),
            "shape": args.shape,
            "lengths": {name: SHAPES[name].describe() for name in shapes},
            "loads": [{"part": part_name(s, c), "shape": s, "clients": c} for s, c in loads],
            "shape_change": args.shape_change or None,
            "warmup_s": args.warmup_s,
            "window_s": args.window_s,
            "settle_s": args.settle_s,
            "rounds": args.rounds,
            "rounds_per_block": args.rounds_per_block,
            "arms": args.arms.split(","),
            "nightjar": {
                "learn_s": args.nightjar_learn_s,
                "run_s": args.nightjar_s if args.rounds_per_block > 1 else None,
                "exploration": args.nightjar_exploration,
            },
            "measured_table": {
                "path": args.measured_table,
                "ranges": read_table(args.measured_table),
            },
            "daemon": daemon_meta(args),
        }
    )
    live = Run(args, result)
    if not await wait_started(live):
        return 1
    # The loads leave room for the shape change's smallest run: on 2026-12-01 (14:35, 14:56)
    # a load took the time it needed and the change was skipped 3-8 s short.
    reserve = live.change_needs_s(block_unit(args.rounds_per_block)) if args.shape_change else 0.0
    for load in result["meta"]["loads"]:
        part, shape, clients = load["part"], load["shape"], load["clients"]
        await live.fitted_part(
            part,
            live.load_needs_s,
            lambda r, p=part, s=shape, c=clients: live.one_load(p, s, c, r),
            reserve_s=reserve,
        )
    if args.shape_change:
        before, after, clients = parse_change(args.shape_change)
        await live.fitted_part(change_part(before, after, clients), live.change_needs_s,
                               lambda r: live.shape_change(before, after, clients, r))  # fmt: skip
    return live.finish()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_job_arguments(parser)
    parser.add_argument("--loads", default="128,192,64",
                        help="clients per load, in this order; SHAPE:N for another shape than "
                        "--shape's; none: only the --shape-change")  # fmt: skip
    parser.add_argument("--warmup-s", type=float, default=6)
    parser.add_argument("--window-s", type=float, default=6)
    parser.add_argument("--settle-s", type=float, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rounds-per-block", type=int, default=1,
                        help="interleaved blocks: consecutive rounds pooled per arm, compared "
                        "block by block (even; 1: no blocks)")  # fmt: skip
    parser.add_argument("--arms", default=",".join(ARMS),
                        help="which, of " + ",".join(KNOWN_ARMS))  # fmt: skip
    parser.add_argument("--nightjar-learn-s", type=float, default=12,
                        help="the nightjar arm learns this long before each window")  # fmt: skip
    parser.add_argument("--nightjar-s", type=float, default=24,
                        help="in a run of blocks, the nightjar arm's windows run this long, "
                        "once per load after its learning")  # fmt: skip
    parser.add_argument("--nightjar-exploration", type=float, default=0.25,
                        help="its UCB1 constant (bench/evaluate.py's best)")  # fmt: skip
    parser.add_argument("--profile", default=None,
                        help=f"the daemon's prior (default {PROFILE}.json)")  # fmt: skip
    parser.add_argument("--measured-table", default=None,
                        help="the profile's table file (tabletune solve's output; default "
                        f"{PROFILE}.table.json)")  # fmt: skip
    parser.add_argument("--start-table", default=json.dumps(QUARTER_DOCUMENTED))
    parser.add_argument("--daemon-cycle-s", type=float, default=3)
    parser.add_argument("--daemon-s", type=float, default=36)
    parser.add_argument("--shape-change", default="",
                        help="BEFORE:AFTER:N: after the loads, the daemon under BEFORE traffic of "
                        "N clients, switched to AFTER under it")  # fmt: skip
    parser.add_argument("--change-before-s", type=float, default=36)
    parser.add_argument("--change-after-s", type=float, default=90)
    parser.add_argument("--work", default=None,
                        help="the daemon's state and logs (default: a fresh temporary folder, "
                        "so no earlier run's state is restored)")  # fmt: skip
    add_traffic_arguments(parser, default_shape="chat-like")
    args = parser.parse_args()
    args.work = args.work or tempfile.mkdtemp(prefix="tt-daemon-")
    args.profile = args.profile or PROFILE.format(model=args.model) + ".json"
    args.measured_table = args.measured_table or PROFILE.format(model=args.model) + ".table.json"
    checked_shape(parser, args)
    try:
        if not parse_loads(args.loads, args.shape) and not args.shape_change:
            raise ValueError("--loads none: nothing to run without --shape-change")
        if args.shape_change:
            parse_change(args.shape_change)
    except ValueError as error:
        parser.error(str(error))
    try:
        read_table(args.measured_table)
    except (OSError, KeyError, TypeError, ValueError) as error:
        parser.error(f"--measured-table {args.measured_table}: no table file ({error!r})")
    unknown = set(args.arms.split(",")) - set(KNOWN_ARMS)
    if unknown:
        parser.error(f"--arms: unknown {sorted(unknown)}; known: {','.join(KNOWN_ARMS)}")
    per_block = args.rounds_per_block
    if per_block < 1 or (per_block > 1 and per_block % 2):
        parser.error(f"--rounds-per-block {per_block}: 1 or even (a block: whole pairs of "
                     "rounds, an order and its reverse; no arm keeps a place)")  # fmt: skip
    if per_block > 1 and args.rounds % per_block:
        parser.error(f"--rounds {args.rounds}: whole blocks of {per_block} rounds")
    if args.settle_s < args.sync_interval_s:  # the window's step cells lag by up to one sync
        parser.error(
            f"--settle-s {args.settle_s:g} < the plugin's sync interval "
            f"{args.sync_interval_s:g} s: a window's step cells would mix two arms"
        )
    if not 0 <= args.nightjar_exploration <= 100 or args.nightjar_learn_s < 0:
        parser.error("--nightjar-exploration: 0..100; --nightjar-learn-s: >= 0")
    if not args.nightjar_s > 0:
        parser.error(f"--nightjar-s {args.nightjar_s:g}: > 0")
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
