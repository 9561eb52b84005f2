"""Table build: the best k per batch size, changed only on a clear gain, in ranges wide enough.

Per batch size B (goodput G = B * tau(k) / T, sigma_G / G = sigma_T / T):
- the reference k is the baseline's (the running table) where one is given and allowed, else
  the previous B's choice (the sticky chain; at B=1 without a baseline, the best k);
- switch to the best allowed k* only if G(k*) > G(ref) * (1 + stickiness) AND
  G(k*) - G(ref) > z * sqrt(sigma_G(k*)^2 + sigma_G(ref)^2): near-ties and gains inside the
  measurement noise must not fragment the table or flip it on a noisy cell. Where k* does not
  clear that bar, the best k that does (and lies within k*'s noise) is taken: an uncertain
  leader must not hold back a clear gain over the reference.
Then no range stays narrower than ``min_width`` (the plugin's hysteresis band): the narrowest
run (leftmost on a tie) takes the k of the neighbour that keeps the most goodput over it (the
left one on a tie), until none is too narrow or the table is one range. The ends get no
exception: a short range at either end is as hard to reach through the hysteresis as any other.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from tabletune.solver.model import StepTimes, goodput_matrix
from tabletune.solver.problem import DEFAULT_STICKINESS, TableProblem
from tabletune.solver.ranges import Range, compress
from tabletune.solver.solution import RangeSummary, Solution


def solve(problem: TableProblem) -> Solution:
    """The table for ``problem``, self-checked (``Solution.check``) before it is returned."""
    st = problem.step_times
    ks = sorted(problem.allowed_k)
    rows = [st.ks.index(k) for k in ks]
    g = goodput_matrix(st, problem.rates, problem.max_batch)[rows]
    relative = np.zeros_like(g) if problem.uncertainty is None else problem.uncertainty[rows]
    sigma = g * relative
    best = np.argmax(g, axis=0)  # first (smallest k) wins exact ties
    reference = np.full(problem.max_batch, -1)
    if problem.baseline is not None:
        baseline = np.asarray(problem.baseline)
        row_of = np.full(max(ks[-1], int(baseline.max())) + 1, -1)  # -1: k not allowed
        row_of[ks] = np.arange(len(ks))
        reference = row_of[baseline]
    rule = _noise_aware_choice(g, sigma, best, reference, problem)
    final = _merge_narrow_runs(rule, g, problem.min_width)
    columns = np.arange(problem.max_batch)
    k_of = np.asarray(ks)
    solution = Solution(
        ranges=tuple((start, end, ks[row]) for start, end, row in compress(final)),
        per_batch_k=tuple(k_of[final].tolist()),
        best_k=tuple(k_of[best].tolist()),
        goodput=tuple(g[final, columns].tolist()),
        best_goodput=tuple(g[best, columns].tolist()),
        allowed_k=frozenset(problem.allowed_k),
        stickiness=problem.stickiness,
        goodput_sigma=tuple(sigma[final, columns].tolist()),
        best_goodput_sigma=tuple(sigma[best, columns].tolist()),
        rule_k=tuple(k_of[rule].tolist()),
        confidence=problem.confidence,
        min_width=problem.min_width,
        summaries=_summaries(ks, g, sigma, best, rule, final, problem),
    )
    solution.check()
    return solution


def build_table(
    step_times: StepTimes,
    rates: Sequence[float],
    *,
    allowed_k: Iterable[int] | None = None,
    max_batch: int | None = None,
    stickiness: float = DEFAULT_STICKINESS,
) -> Solution:
    """The goodput-maximising table for acceptance ``rates`` over B = 1..max_batch, exact T
    (no uncertainty, no baseline, min width 1): ``solve`` with those settings."""
    return solve(
        TableProblem(
            step_times=step_times,
            rates=rates,
            allowed_k=frozenset(step_times.ks if allowed_k is None else allowed_k),
            max_batch=step_times.max_batch if max_batch is None else max_batch,
            stickiness=stickiness,
        )
    )


def _noise_aware_choice(
    g: np.ndarray,
    sigma: np.ndarray,
    best: np.ndarray,
    reference: np.ndarray,
    problem: TableProblem,
) -> np.ndarray:
    """Row per column: the reference row unless a row beats it clearly (module doc).

    ``clear[r, c]``: some row beats row r clearly at column c; ``better[r, c]``: the one with
    the highest goodput among those that do and are themselves within the best row's noise.
    Columns with a baseline reference are decided at once; chained ones (reference -1) walk
    from one switch to the next, so the Python work grows with the switches, not with max_B.
    """
    columns = np.arange(g.shape[1])
    z, stickiness = problem.confidence, problem.stickiness
    # beats[q, r, c]: row q beats row r clearly at column c
    beats = (g[:, None] > g[None] * (1.0 + stickiness)) & (
        g[:, None] - g[None] > z * np.hypot(sigma[:, None], sigma[None])
    )
    g_best, sigma_best = g[best, columns], sigma[best, columns]
    near_best = (g * (1.0 + stickiness) >= g_best) | (g_best - g <= z * np.hypot(sigma, sigma_best))
    eligible = beats & near_best[:, None]
    clear = eligible.any(axis=0)
    better = np.argmax(np.where(eligible, g[:, None], -np.inf), axis=0)
    fixed = reference >= 0
    ref = np.maximum(reference, 0)
    from_reference = np.where(clear[ref, columns], better[ref, columns], reference)
    choice = np.where(fixed, from_reference, best)
    switches: dict[int, np.ndarray] = {}  # per row, the columns where it is clearly beaten
    for start, end, is_fixed in compress(fixed.tolist()):
        if is_fixed:
            continue
        column = start - 1  # chained columns start - 1 .. end - 1 (0-based)
        row = int(choice[column - 1]) if column > 0 else int(best[0])
        while column < end:
            ahead = switches.get(row)
            if ahead is None:
                ahead = switches[row] = np.flatnonzero(clear[row])
            found = int(np.searchsorted(ahead, column))
            switch = int(ahead[found]) if found < len(ahead) else end
            switch = min(switch, end)
            choice[column:switch] = row
            if switch < end:
                row = int(better[row, switch])
                choice[switch] = row
            column = switch + 1
    return choice


def _merge_narrow_runs(choice: np.ndarray, g: np.ndarray, min_width: int) -> np.ndarray:
    """Relabel runs narrower than ``min_width`` until none is left (module doc)."""
    runs = [[start - 1, end - 1, row] for start, end, row in compress(choice)]
    if min_width <= 1 or len(runs) == 1:
        return choice
    # prefix[row, c] = sum of g[row, :c]: the goodput of any row over any run in O(1).
    prefix = np.concatenate([np.zeros((g.shape[0], 1)), np.cumsum(g, axis=1)], axis=1)
    while len(runs) > 1:
        width, index = min((end - start + 1, i) for i, (start, end, _) in enumerate(runs))
        if width >= min_width:
            break
        start, end = runs[index][0], runs[index][1]
        neighbours = [j for j in (index - 1, index + 1) if 0 <= j < len(runs)]
        kept = [float(prefix[runs[j][2], end + 1] - prefix[runs[j][2], start]) for j in neighbours]
        row = runs[neighbours[kept.index(max(kept))]][2]  # the left one on a tie
        low = index - 1 if index > 0 and runs[index - 1][2] == row else index
        high = index + 1 if index + 1 < len(runs) and runs[index + 1][2] == row else index
        runs[low : high + 1] = [[runs[low][0], runs[high][1], row]]
    return np.repeat([row for _, _, row in runs], [end - start + 1 for start, end, _ in runs])


def _summaries(
    ks: list[int],
    g: np.ndarray,
    sigma: np.ndarray,
    best: np.ndarray,
    rule: np.ndarray,
    final: np.ndarray,
    problem: TableProblem,
) -> tuple[RangeSummary, ...]:
    """Per range: mean goodput and sigma, the best other k, and why (counts per reason)."""
    bounds = compress(final)
    starts = np.array([start - 1 for start, _, _ in bounds])
    ends = np.array([end for _, end, _ in bounds])
    rows = np.array([row for _, _, row in bounds])
    widths = ends - starts
    order = np.arange(len(bounds))

    def span_means(values: np.ndarray) -> np.ndarray:
        prefix = np.cumsum(values, axis=-1)
        prefix = np.concatenate([np.zeros((*values.shape[:-1], 1)), prefix], axis=-1)
        result: np.ndarray = (prefix[..., ends] - prefix[..., starts]) / widths
        return result

    columns = np.arange(problem.max_batch)
    means = span_means(g)  # (k rows, ranges)
    others = means.copy()
    others[rows, order] = -np.inf
    alternative = np.argmax(others, axis=0)  # the smallest k on a tie
    chosen = g[final, columns]
    merged = rule != final
    at_best = ~merged & (best == final)
    near = chosen * (1.0 + problem.stickiness) >= g[best, columns] * (1.0 - 1e-12)
    reasons = np.vstack([at_best, ~merged & ~at_best & near, ~merged & ~at_best & ~near])
    counts = np.rint(span_means(reasons.astype(float)) * widths).astype(int).T.tolist()
    sigmas = span_means(sigma[final, columns]).tolist()
    absorbed: list[list[tuple[int, int, int]]] = [[] for _ in bounds]
    for a, b, r in compress(rule):
        if merged[a - 1]:  # a merge relabels whole runs
            absorbed[int(np.searchsorted(ends, b))].append((a, b, ks[r]))
    out = []
    for i, (start, end, row) in enumerate(bounds):
        alt = int(alternative[i]) if len(ks) > 1 else None
        margin = None if alt is None else float(means[row, i] / means[alt, i] - 1)
        out.append(
            RangeSummary(
                start=start,
                end=end,
                k=ks[row],
                goodput=float(means[row, i]),
                goodput_sigma=sigmas[i],
                alternative_k=None if alt is None else ks[alt],
                alternative_margin=margin,
                absorbed=tuple(absorbed[i]),
                why=_why(end - start + 1, counts[i], tuple(absorbed[i]), problem),
            )
        )
    return tuple(out)


def _why(width: int, counts: list[int], absorbed: tuple[Range, ...], problem: TableProblem) -> str:
    """``counts``: batch sizes where k is the best, within the stickiness, within z sigma."""
    at_best, sticky, noisy = counts
    parts = [
        f"best k at {at_best} of {width} B" if at_best else "",
        f"within {problem.stickiness:.1%} of the best at {sticky}" if sticky else "",
        f"within {problem.confidence:g} sigma of the best at {noisy}" if noisy else "",
        f"min width {problem.min_width}: took over "
        + ", ".join(f"{a}..{b} (k={k})" for a, b, k in absorbed)
        if absorbed
        else "",
    ]
    return "; ".join(part for part in parts if part)
