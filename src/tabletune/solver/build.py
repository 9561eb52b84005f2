"""Table build: the best k per batch size, changed only on a clear gain, in ranges wide enough.

Per batch size B (goodput G = B * tau(k) / T, sigma_G / G = sigma_T / T):
- the reference k is the baseline's (the running table) where one is given and allowed, else
  the previous B's choice (the sticky chain; at B=1 without a baseline, the best k);
- switch to the best allowed k* only if G(k*) > G(ref) * (1 + stickiness) AND
  G(k*) - G(ref) > z * sqrt(sigma_G(k*)^2 + sigma_G(ref)^2): near-ties and gains inside the
  measurement noise must not fragment the table or flip it on a noisy cell.
Then no range stays narrower than ``min_width`` (the plugin's hysteresis band): the narrowest
run (leftmost on a tie) takes the k of the neighbour that keeps the most goodput over it (the
left one on a tie), until none is too narrow or the table is one range. The ends get no
exception: a short range at either end is as hard to reach through the hysteresis as any other.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from tabletune.solver.model import StepTimes, goodput_matrix
from tabletune.solver.problem import DEFAULT_STICKINESS, TableProblem
from tabletune.solver.ranges import compress
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
    reference = [-1] * problem.max_batch
    if problem.baseline is not None:
        reference = [ks.index(k) if k in problem.allowed_k else -1 for k in problem.baseline]
    rule = _noise_aware_choice(g, sigma, best.tolist(), reference, problem)
    final = _merge_narrow_runs(rule, g, problem.min_width)
    columns = np.arange(problem.max_batch)
    solution = Solution(
        ranges=tuple((start, end, ks[row]) for start, end, row in compress(final)),
        per_batch_k=tuple(ks[row] for row in final),
        best_k=tuple(ks[row] for row in best.tolist()),
        goodput=tuple(g[final, columns].tolist()),
        best_goodput=tuple(g[best, columns].tolist()),
        allowed_k=frozenset(problem.allowed_k),
        stickiness=problem.stickiness,
        goodput_sigma=tuple(sigma[final, columns].tolist()),
        best_goodput_sigma=tuple(sigma[best, columns].tolist()),
        rule_k=tuple(ks[row] for row in rule),
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
    best: list[int],
    reference: list[int],
    problem: TableProblem,
) -> list[int]:
    """Row per column: the reference row unless the best row beats it clearly (module doc)."""
    keep = 1.0 + problem.stickiness
    z = problem.confidence
    g_columns = g.T.tolist()
    sigma_columns = sigma.T.tolist()
    choice: list[int] = []
    for column, star in enumerate(best):
        ref = reference[column]
        if ref < 0:
            ref = choice[-1] if choice else star
        if star != ref:
            goodput, spread = g_columns[column], sigma_columns[column]
            gain = goodput[star] - goodput[ref]
            noise = z * math.hypot(spread[star], spread[ref])
            if not (goodput[star] > goodput[ref] * keep and gain > noise):
                star = ref
        choice.append(star)
    return choice


def _merge_narrow_runs(choice: list[int], g: np.ndarray, min_width: int) -> list[int]:
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
    merged: list[int] = []
    for start, end, row in runs:
        merged.extend([row] * (end - start + 1))
    return merged


def _summaries(
    ks: list[int],
    g: np.ndarray,
    sigma: np.ndarray,
    best: np.ndarray,
    rule: list[int],
    final: list[int],
    problem: TableProblem,
) -> tuple[RangeSummary, ...]:
    final_rows = np.asarray(final)
    rule_rows = np.asarray(rule)
    columns = np.arange(problem.max_batch)
    chosen = g[final_rows, columns]
    near = chosen * (1.0 + problem.stickiness) >= g[best, columns] * (1.0 - 1e-12)
    out = []
    for start, end, row in compress(final):
        span = slice(start - 1, end)
        means = g[:, span].mean(axis=1)
        others = [r for r in range(len(ks)) if r != row]
        alternative = max(others, key=lambda r: (means[r], -r)) if others else None
        absorbed = tuple(
            (a, b, ks[r]) for a, b, r in compress(rule) if start <= a and b <= end and r != row
        )
        merged = rule_rows[span] != row
        at_best = ~merged & (best[span] == row)
        sticky = ~merged & ~at_best & near[span]
        noisy = ~merged & ~at_best & ~near[span]
        parts = [
            f"best k at {int(at_best.sum())} of {end - start + 1} B" if at_best.any() else "",
            f"within {problem.stickiness:.1%} of the best at {int(sticky.sum())}"
            if sticky.any()
            else "",
            f"within {problem.confidence:g} sigma of the best at {int(noisy.sum())}"
            if noisy.any()
            else "",
            f"min width {problem.min_width}: took over "
            + ", ".join(f"{a}..{b} (k={k})" for a, b, k in absorbed)
            if absorbed
            else "",
        ]
        out.append(
            RangeSummary(
                start=start,
                end=end,
                k=ks[row],
                goodput=float(means[row]),
                goodput_sigma=float(sigma[row, span].mean()),
                alternative_k=None if alternative is None else ks[alternative],
                alternative_margin=(
                    None if alternative is None else float(means[row] / means[alternative] - 1)
                ),
                absorbed=absorbed,
                why="; ".join(p for p in parts if p),
            )
        )
    return tuple(out)
