"""Live step time T_hat(B, k): the profile as a prior, corrected by the step cells the plugin
counts in the engine (steps that decode, prefill riding along). Pure: no I/O, no clock.

Per cell (k, batch range) the live sums fade with a half-life, so recent traffic dominates.
The estimate is a ratio to the profile, blended the way a_hat is (the prior weighs ``w`` steps):

    r_live = mean live step time / T_profile(mean live B, k)
    m(c)   = (w * 1 + sum_k n_k r_live_k) / (w + sum_k n_k)     (every k at this batch cell)
    r_hat  = (w * m(c) + n r_live) / (w + n)
    T_hat(B, k) = T_profile(B, k) * r_hat(k, cell of B)

Where the load ran, T_hat is held flat across the cell at the batch size it ran at (live data
speaks for the cell; the profile's wiggles inside it do not). A k with little live data leans
on ``m(c)``, what the other k at the same batch sizes show (among the k whose kind of CUDA
graph, full or off it, the live traffic keeps as the profile timed it; apart, those it takes
off the graph; with no capture limit known, the profile's kinds), rather than on the bare
profile: a cost common to every k (long contexts) then does not make
the unobserved k look cheap, while an effect of one k (a graph miss) shows once that k is
observed (the plugin's neighbour exploration sees to it). A k with ``MEASURED_STEPS`` steps of
its own at a cell counts as measured there, its steps faded or not, until the cell's traffic
changes (a shift, below) or the cell loses sight of it (its steps too few to see a shift): a
k measured worse than the running one is not explored again each time its evidence fades.
After a shift, one with fewer steps of its own than ``w`` where another k has as many is
``unproven``: its estimate leans on what the other k show under the new traffic (or, alone in
its graph kind, on its own few steps), and the decision does not trust it over them. The
seconds after a shift run slow while the traffic settles: ``settle_s`` later, a k that ran
the cell meanwhile and runs it no more is forgotten once more (it stood on those seconds
alone). The uncertainty of r_hat combines the prior's (weight w, spread ``prior_sigma`` as a
share of what it pulls toward) and the live mean's (per-step variance, steps counted as
``1/correlation`` independent samples, since neighbouring steps are alike; a cell of too few
steps for its own takes the replica's spread as a share of the step, at its own level). A k
that left the graph is pulled toward its own group's live
steps, so the pull adds no confidence: their standard error stays whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tabletune.solver import StepTimes
from tabletune.step_cells import CellTotals, StepCells, cells_up_to

if TYPE_CHECKING:
    from tabletune.daemon.profiles import PoolProfile

FIELDS = 5  # steps, seconds, seconds_sq, tokens, requests (CellTotals order)
# Live steps of its own a (k, batch cell) needs, since the cell's traffic last changed, before
# its estimate (rather than the profile's promise, or what the other k show) speaks for it;
# also the fresh steps of the running k a shift of traffic is judged on.
MEASURED_STEPS = 30.0
# T_hat / profile T of a k nothing live speaks for (a group of its own with no steps): far
# enough that no table picks it, finite so that every sum over it stays a number.
UNKNOWN_RATIO = 1e3
SHIFT_MIN_STEPS = 200.0  # past steps of the running k before a shift of traffic is judged
# Faded steps from which a cell counts as watching its traffic (it can lose sight of it once
# they fade under SHIFT_MIN_STEPS): twice that, so one cycle's fading just past the bar is not
# a loss of sight.
WATCH_STEPS = 2 * SHIFT_MIN_STEPS
FORGET_ON_SHIFT = 0.02  # what a cell keeps of its past after a shift
# A step's relative spread before any cell has steps enough for its own: the median of the
# H200 fixed arms' under users' traffic (0.52 over 173 arms and cells, 0.04-0.96).
STEP_SPREAD_WITHOUT_DATA = 0.5


@dataclass(frozen=True)
class StepTimeParams:
    """How live data and the profile are blended (the daemon's ``step_time`` settings)."""

    prior_steps: float = 100.0
    half_life_s: float = 60.0
    prior_sigma: float = 0.05
    correlation: float = 4.0
    min_sigma: float = 0.002


@dataclass(frozen=True)
class CellEstimate:
    k: int
    cell: tuple[int, int]
    steps: float  # live steps (after fading)
    live_ratio: float  # live mean / profile at the live mean batch size (nan without data)
    ratio: float  # r_hat
    sigma: float  # standard error of r_hat
    mean_tokens: float  # scheduled tokens per step (nan without data)


@dataclass(frozen=True)
class StepTimeEstimate:
    """T_hat on the dense grid 1..max_batch with its relative uncertainty, and per cell (rows
    follow the profile's ks, columns the layout's cells) the live steps, live ratio, r_hat,
    its standard error, the scheduled tokens per step and the steps counted as measured."""

    step_times: StepTimes  # grid 1..max_batch, the profile's ks
    relative_sigma: np.ndarray  # sigma(T_hat)/T_hat, rows follow ks, columns B-1
    ks: tuple[int, ...]
    cells: tuple[tuple[int, int], ...]
    steps: np.ndarray
    live_ratio: np.ndarray  # nan without data
    ratio: np.ndarray
    sigma: np.ndarray
    mean_tokens: np.ndarray  # nan without data
    measured: np.ndarray  # live steps since the cell's traffic last changed (not faded)
    ran: np.ndarray  # of those, the steps it ran as the cell's busiest k (not in bursts)
    # Rows ks, columns B-1: the traffic there shifted, and T_hat rests on other k's live
    # steps since then more than on this k's own (fewer than the prior's weight w, while
    # another k of its graph kind has as many).
    unproven: np.ndarray

    def cell(self, row: int, col: int) -> CellEstimate:
        return CellEstimate(
            k=self.ks[row],
            cell=self.cells[col],
            steps=float(self.steps[row, col]),
            live_ratio=float(self.live_ratio[row, col]),
            ratio=float(self.ratio[row, col]),
            sigma=float(self.sigma[row, col]),
            mean_tokens=float(self.mean_tokens[row, col]),
        )

    def observed(self, min_steps: float) -> tuple[CellEstimate, ...]:
        rows, cols = np.nonzero(self.steps >= min_steps)
        return tuple(self.cell(int(r), int(c)) for r, c in zip(rows, cols, strict=True))


class StepTimeLayout:
    """The cells and profile a replica's estimate lives on (shared by a pool's replicas)."""

    def __init__(
        self,
        profile: StepTimes,
        max_batch: int,
        *,
        off_graph: np.ndarray | None = None,
        capture_limit: int | None = None,
    ) -> None:
        """``off_graph`` (rows ks, columns the profile's grid): the profile cells that ran off
        the full CUDA graph (past the capture limit); None: all alike. ``capture_limit``: the
        engine's largest full graph in tokens (None: unknown; no cell is taken to leave it)."""
        if not 1 <= max_batch <= profile.max_batch:
            raise ValueError(f"max_batch {max_batch} outside 1..{profile.max_batch}")
        shape = (len(profile.ks), len(profile.grid))
        if off_graph is not None and off_graph.shape != shape:
            raise ValueError(f"off_graph shape {off_graph.shape} != {shape}")
        self.profile = profile
        self.max_batch = max_batch
        self.capture_limit = capture_limit
        self.ks = profile.ks
        self.cells = cells_up_to(max_batch)
        self._k_row = {k: i for i, k in enumerate(self.ks)}
        self._cell_col = {cell: j for j, cell in enumerate(self.cells)}
        # column of each batch size's cell, for B = 1..max_batch
        self.cell_of_batch = np.array(
            [j for j, (low, high) in enumerate(self.cells) for _ in range(low, high + 1)][
                :max_batch
            ]
        )
        self.prior_ms = profile.dense(max_batch)  # rows ks, columns B-1
        # (cells x B) weights: a row averages a per-B quantity over that cell's batch sizes
        self.cell_average = np.zeros((len(self.cells), max_batch))
        for j, (low, high) in enumerate(self.cells):
            top = min(high, max_batch)
            self.cell_average[j, low - 1 : top] = 1.0 / (top - low + 1)
        self._grid = np.asarray(profile.grid, dtype=float)
        # Per (k, cell): did the profile time it off the full graph? A cell reads the first
        # grid point at or above its top (the fast profiler's grid points are cells' tops).
        at = np.minimum(np.searchsorted(self._grid, [high for _, high in self.cells]),
                        len(profile.grid) - 1)  # fmt: skip
        self.off_graph = (
            np.zeros((len(self.ks), len(self.cells)), dtype=bool)
            if off_graph is None
            else np.asarray(off_graph, dtype=bool)[:, at]
        )

    @classmethod
    def of_pool(cls, pool: PoolProfile) -> StepTimeLayout:
        """A pool's layout over its whole grid, with the graph kinds and capture limit its
        profile records (what the daemon and the replays of recorded runs estimate on)."""
        return cls(
            pool.step_times,
            pool.step_times.max_batch,
            off_graph=pool.off_graph,
            capture_limit=pool.capture_limit,
        )

    def index(self, k: int, low: int, high: int) -> tuple[int, int] | None:
        row = self._k_row.get(k)
        col = self._cell_col.get((low, high))
        return None if row is None or col is None else (row, col)

    def prior_at(self, batch: np.ndarray) -> np.ndarray:
        """Profile T in seconds at (possibly fractional) batch sizes, rows follow ks."""
        rows = [np.interp(batch[i], self._grid, self.profile.ms[i]) for i in range(len(self.ks))]
        return np.vstack(rows) / 1000.0


class StepTimeEstimator:
    """The fading live sums of one replica."""

    def __init__(self, layout: StepTimeLayout) -> None:
        self.layout = layout
        self.sums = np.zeros((len(layout.ks), len(layout.cells), FIELDS))
        # Steps per (k, cell) since the cell's traffic last changed: they do not fade.
        self.measured = np.zeros((len(layout.ks), len(layout.cells)))
        self.ran = np.zeros((len(layout.ks), len(layout.cells)))  # of those, as the busiest k
        self.shifted = np.zeros(len(layout.cells), dtype=bool)  # its traffic changed
        # Its steps have been many enough to see a shift (WATCH_STEPS) since its traffic changed.
        self.watching = np.zeros(len(layout.cells), dtype=bool)
        # When a shifted cell's settling ends (inf: none pending): see add().
        self.settle_until = np.full(len(layout.cells), math.inf)
        # Each cell's busiest k (row; -1: none yet) and when another k last took it over.
        self.runner = np.full(len(layout.cells), -1)
        self.runner_since = np.full(len(layout.cells), -math.inf)
        self.updated_at: float | None = None
        self.shifted_at: float | None = None  # when a cell's traffic last shifted

    def add(
        self,
        cells: StepCells,
        now: float,
        *,
        half_life_s: float,
        shift: float = math.inf,
        correlation: float = 1.0,
        settle_s: float = 0.0,
    ) -> int:
        """Fade the sums to ``now``, then add one interval's increases. Returns how many
        cells were outside the layout (an unprofiled k, or a batch beyond the profile).

        A change of traffic (a new shape: longer prompts, other contexts) moves every k's
        step time at once, but only the k that runs shows it. When the k with the most steps
        in a cell this interval (the table's) moved by more than ``shift`` (relative, and well
        outside its noise, its steps counted as ``1/correlation`` independent samples as in the
        estimate; ``SHIFT_MIN_STEPS`` before, ``MEASURED_STEPS`` now), what the cell
        knew of the other k is forgotten too: they count as unmeasured again, so they are
        explored afresh instead of being judged on the old traffic. A cell whose steps faded
        below what that check needs can no longer see such a change: what its k counted as
        measured goes too. The traffic settles for a while after such a change (the old
        shape's requests drain, the new one's prompts queue), every k's steps slow meanwhile,
        and a k that ran then would be judged on that: ``settle_s`` (0: off) after a shift,
        what a k learnt while it ran the cell and has stopped running it since is forgotten
        once more, before the interval's steps count. The traffic moves too when the cell's
        busiest k changes (its requests finish, and prompts arrive, at that k's pace): for
        ``settle_s`` after, no shift is read there."""
        if self.updated_at is not None and now > self.updated_at:
            self.sums *= 0.5 ** ((now - self.updated_at) / half_life_s)
            # Only a cell that could see a shift can lose sight of one: a cell whose sums were
            # just forgotten is not blind while they grow back, however they fade meanwhile.
            blind = self.watching & (self.sums[..., 0].max(axis=0) < SHIFT_MIN_STEPS)
            self.measured[:, blind] = 0.0
            self.ran[:, blind] = 0.0
            self.shifted[blind] = False
            self.watching[blind] = False
        self.updated_at = now if self.updated_at is None else max(now, self.updated_at)
        outside = 0
        rows: list[tuple[tuple[int, int], np.ndarray]] = []
        for (k, low, high), totals in cells.items():
            where = self.layout.index(k, low, high)
            if where is None:
                outside += 1
                continue
            rows.append((where, _as_row(totals)))
        running: dict[int, tuple[int, np.ndarray]] = {}  # per cell, its busiest k's row
        for (row, col), fresh in rows:
            if col not in running or fresh[0] > running[col][1][0]:
                running[col] = (row, fresh)
        self._settle(np.flatnonzero(self.settle_until <= now), running)
        for col, (row, fresh) in running.items():
            if self.runner[col] not in (-1, row):
                self.runner_since[col] = now
            self.runner[col] = row
            if settle_s > 0 and now - self.runner_since[col] < settle_s:
                continue  # the cell's own change of k moved its traffic: not a shift
            if self._shifted(self.sums[row, col], fresh, shift, correlation):
                self._forget(col)
                self.watching[col] = False
                self.shifted[col] = True
                self.shifted_at = now
                if settle_s > 0:
                    self.settle_until[col] = now + settle_s
        for where, fresh in rows:
            self.sums[where] += fresh
            self.measured[where] += fresh[0]
        for col, (row, fresh) in running.items():
            self.ran[row, col] += fresh[0]
        self.watching |= self.sums[..., 0].max(axis=0) >= WATCH_STEPS
        return outside

    def _forget(self, col: int, rows: slice | np.ndarray = slice(None)) -> None:
        """What the cell's k (``rows``, all by default) showed, but FORGET_ON_SHIFT of it; none
        of them counts as measured there or as having run it."""
        self.sums[rows, col] *= FORGET_ON_SHIFT
        self.measured[rows, col] = 0.0
        self.ran[rows, col] = 0.0

    def _settle(self, cols: np.ndarray, running: dict[int, tuple[int, np.ndarray]]) -> None:
        """Settled cells forget what a k showed while it ran the cell during the settling
        and no longer does: it stood on that alone, for good (the bursts go by estimates).
        A burst runs beside the running k, so both see the same seconds; the k running now
        keeps being measured, so its transient fades under fresh steps."""
        for col in cols:
            now_running = running.get(col, (-1,))[0]
            ran = np.flatnonzero(self.ran[:, col] > 0)
            self._forget(col, ran[ran != now_running])
        self.settle_until[cols] = math.inf

    @staticmethod
    def _shifted(old: np.ndarray, fresh: np.ndarray, shift: float, correlation: float) -> bool:
        if old[0] < SHIFT_MIN_STEPS or fresh[0] < MEASURED_STEPS or not math.isfinite(shift):
            return False
        old_mean = float(old[1] / old[0])
        new_mean = float(fresh[1] / fresh[0])
        new_var = max(float(fresh[2] / fresh[0]) - new_mean * new_mean, 0.0)
        # Neighbouring steps are alike (what the host does that second): counted as
        # independent, the H200's steady traffic read as a change 9 times in 23 daemon parts
        # replayed in 3 s cycles, 5 with the estimate's correlation of 2 (the one change of
        # shape caught in the same cycle).
        noise = math.sqrt(new_var * correlation / float(fresh[0]))
        change = abs(new_mean - old_mean)
        return change > shift * old_mean and change > 4.0 * noise

    def clear(self) -> None:
        """Forget live data (the engine restarted, possibly with other settings)."""
        self.sums[:] = 0.0
        self.measured[:] = 0.0
        self.ran[:] = 0.0
        self.shifted[:] = False
        self.watching[:] = False
        self.settle_until[:] = math.inf
        self.runner[:] = -1
        self.runner_since[:] = -math.inf

    def estimate(
        self, params: StepTimeParams, *, prior_sigma: np.ndarray | None = None
    ) -> StepTimeEstimate:
        """T_hat and its uncertainty. ``prior_sigma`` (rows ks, columns B-1): the profile's own
        relative uncertainty; the larger of it and ``params.prior_sigma`` is used."""
        layout = self.layout
        steps = self.sums[..., 0]
        seen = steps > 0
        safe = np.where(seen, steps, 1.0)
        mean_s = self.sums[..., 1] / safe
        mean_batch = np.where(seen, self.sums[..., 4] / safe, 1.0)
        prior_s = layout.prior_at(mean_batch)
        live = np.where(seen, mean_s / prior_s, np.nan)
        variance = np.where(
            steps >= 2, np.maximum(self.sums[..., 2] / safe - mean_s**2, 0.0) / prior_s**2, 0.0
        )
        # Per-step variance where a cell has too few steps of its own: the replica's pooled one,
        # as a share of the step, at the cell's own level (a k running 4x its profile spreads
        # 4x as far in the profile's units as one running at 1x).
        rich = steps >= 30
        level = np.where(seen, np.nan_to_num(live, nan=1.0), 1.0)
        shares = variance / level**2
        pooled = (
            float(np.average(shares[rich], weights=steps[rich]))
            if rich.any()
            else STEP_SPREAD_WITHOUT_DATA**2
        )
        variance = np.where(rich, variance, pooled * level**2)

        w = params.prior_steps
        weighted = np.where(seen, steps * np.nan_to_num(live), 0.0)
        # What the other k of a batch cell show, among the k whose steps the traffic leaves on
        # the kind of graph the profile timed them on: a ratio that includes a fall off the
        # full graph (chat-like prompts push k=0/1 off it) says nothing of a k the profile
        # timed eager, while prompt tokens riding on steps that keep their kind cost alike.
        # A k the profile timed on the full graph whose steps at this traffic would not fit it
        # (``left``) forms a group of its own: the profile's T is for another kind of step, so
        # neither the pull toward it nor the ratios of k that stayed on the graph speak for
        # it. With no live step in its group it is unknown: T_hat stands far off so no
        # decision picks it, while the bursts, which go by the profile's promise for a k not
        # measured, still try it. Without a capture limit the groups are the profile's kinds.
        common = np.ones_like(steps)
        own = self.measured >= w
        leaning = np.zeros_like(own)
        left = self._graph_left(steps)
        unknown = np.zeros_like(own)
        moved_k = np.zeros_like(own)
        group_var = np.zeros_like(steps)  # variance of a moved group's live mean ratio
        if layout.capture_limit is None:  # the traffic's graph kinds unknown: the profile's
            groups = [(layout.off_graph == kind, False) for kind in (False, True)]
        else:  # k whose kind the traffic keeps share a ratio (prefill on top of either kind)
            groups = [(~left, False), (left, True)]
        for mine, moved in groups:
            shown = np.where(mine, weighted, 0.0).sum(axis=0)
            counted = np.where(mine, steps, 0.0).sum(axis=0)
            if moved:
                live_mean = shown / np.where(counted > 0, counted, 1.0)
                common = np.where(mine, live_mean[None, :], common)
                unknown |= mine & (counted == 0)[None, :]
                moved_k |= mine
                spread = np.where(mine, variance * params.correlation * steps, 0.0).sum(axis=0)
                spread /= np.where(counted > 0, counted, 1.0) ** 2
                group_var = np.where(mine, spread[None, :], group_var)
            else:
                common = np.where(mine, ((w + shown) / (w + counted))[None, :], common)
            leaning |= mine & (mine & own).any(axis=0)[None, :] & self.shifted[None, :]
        # A k with a few steps of its own since the shift is unproven where the cell's running
        # k has the prior's weight, whether or not a k of its group has: alone in its group
        # (the traffic took it off the graph) it stands on those few alone (H200, decode-heavy
        # B≈254: 3 burst steps of k=1 right after a shift, all on the CUDA graph, put it at
        # 17 ms; it was pushed and ran at twice that). With none it is the profile's, as before.
        runner = np.clip(self.runner, 0, None)
        runner_own = own[runner, np.arange(own.shape[1])] & (self.runner >= 0)
        leaning |= (runner_own & self.shifted)[None, :] & (self.measured > 0)
        ratio = (w * common + weighted) / (w + steps)
        ratio = np.where(unknown, UNKNOWN_RATIO, ratio)

        # The prior's spread is a share of what it pulls toward (under long contexts every k
        # runs a few times its pure-decode profile, and so does the pull).
        prior_spread = w * self._cell_prior_sigma(params, prior_sigma) * common
        noise = variance * params.correlation * steps
        sigma = np.sqrt(prior_spread**2 + noise) / (w + steps)
        # A moved k's pull is toward its group's own live steps, not toward evidence beyond
        # them: w adds no confidence, the steps' own standard error stays (on the H200 at
        # decode-heavy B≈254, k=1 known from 33 burst steps at 27 ms, 0.65 relative spread a
        # step, stood at ±12.5 % where its steps' error was ±16 %, and was pushed; as an arm
        # it ran 31 ms, 8 % behind k=0).
        # The pull's error and the k's own steps' add up as if fully correlated (they are one
        # and the same where the k is its group's only member with steps).
        moved_sigma = np.sqrt(prior_spread**2 + (w * np.sqrt(group_var) + np.sqrt(noise)) ** 2)
        moved_sigma /= w + steps
        sigma = np.where(moved_k, moved_sigma, sigma)
        sigma = np.maximum(sigma, params.min_sigma * ratio)

        columns = layout.cell_of_batch
        dense_ms = layout.prior_ms * ratio[:, columns]
        # Where the load ran, every k of the cell is estimated at the batch size it ran at and
        # held flat across the cell: the live data speaks for the cell, and the profile's
        # wiggles inside it (a noisy cell, a one-off jump) must not make k flip from one batch
        # size to the next. Elsewhere T_hat follows the profile's shape.
        cell_steps = steps.sum(axis=0)
        observed = cell_steps > 0
        if observed.any():
            ran_at = self.sums[..., 4].sum(axis=0)[observed] / cell_steps[observed]
            flat = layout.prior_at(np.tile(ran_at, (len(layout.ks), 1))) * 1000.0
            flat *= ratio[:, observed]
            for j, cell_ms in zip(np.flatnonzero(observed), flat.T, strict=True):
                low, high = layout.cells[j]
                dense_ms[:, low - 1 : min(high, layout.max_batch)] = cell_ms[:, None]
        relative = sigma[:, columns] / ratio[:, columns]
        grid = tuple(range(1, layout.max_batch + 1))
        return StepTimeEstimate(
            step_times=StepTimes(grid=grid, ks=layout.ks, ms=dense_ms),
            relative_sigma=relative,
            ks=layout.ks,
            cells=layout.cells,
            steps=steps.copy(),
            live_ratio=live,
            ratio=ratio,
            sigma=sigma,
            mean_tokens=np.where(seen, self.sums[..., 3] / safe, np.nan),
            measured=self.measured.copy(),
            ran=self.ran.copy(),
            unproven=(leaning & ~own)[:, columns],
        )

    def _graph_left(self, steps: np.ndarray) -> np.ndarray:
        """Per (k, cell): the profile timed k there on the full CUDA graph, but at the cell's
        live traffic a step of k would hold more tokens than the graph does (B·(1+k) plus the
        prefill the busiest k's steps carry; in a cell of fewer than ``MEASURED_STEPS`` steps,
        what every step of the replica carries). On the H200 at decode-heavy B≈254 a k=0 step held
        281 tokens; k=1, timed on the graph at 512, borrowed k=0's ratio and was taken at 22 ms:
        with the prefill it ran eager at 29 ms (docs/results.md)."""
        layout = self.layout
        left = np.zeros(steps.shape, dtype=bool)
        if layout.capture_limit is None:
            return left
        ks = np.asarray(layout.ks, dtype=float)
        # What rides along is the traffic's, not a cell's: a cell with few steps reads it from
        # every step of the replica (H200, chat-like: 9 steps of k=1 at 177-184 carried 180
        # prompt tokens where the load's ran ~1,200; read from them, k=0 stayed on its graph,
        # stood apart on the profile's pure-decode time and was put in, 27 % behind k=3).
        riding = self.sums[..., 3] - self.sums[..., 4] * (1.0 + ks[:, None])
        total = float(steps.sum())
        replica_prefill = max(float(riding.sum()) / total, 0.0) if total > 0 else 0.0
        for col in np.flatnonzero(steps.sum(axis=0) > 0):
            n_cell = float(steps[:, col].sum())
            if n_cell < MEASURED_STEPS:
                batch = float(self.sums[:, col, 4].sum()) / n_cell
                prefill = replica_prefill
            else:
                busiest = int(np.argmax(steps[:, col]))
                n, tokens, requests = self.sums[busiest, col, [0, 3, 4]]
                batch = float(requests / n)
                prefill = max(float(tokens / n) - batch * (1.0 + ks[busiest]), 0.0)
            would = batch * (1.0 + ks) + prefill > layout.capture_limit
            left[:, col] = would & ~layout.off_graph[:, col]
        return left

    def _cell_prior_sigma(
        self, params: StepTimeParams, prior_sigma: np.ndarray | None
    ) -> np.ndarray:
        layout = self.layout
        shape = (len(layout.ks), len(layout.cells))
        if prior_sigma is None:
            return np.full(shape, params.prior_sigma)
        if prior_sigma.shape != (len(layout.ks), layout.max_batch):
            raise ValueError(f"prior_sigma shape {prior_sigma.shape} != {layout.prior_ms.shape}")
        per_cell = prior_sigma @ layout.cell_average.T  # each cell's mean over its batch sizes
        return np.maximum(per_cell, params.prior_sigma)


def _as_row(totals: CellTotals) -> np.ndarray:
    return np.array(
        [totals.steps, totals.seconds, totals.seconds_sq, totals.tokens, totals.requests]
    )
