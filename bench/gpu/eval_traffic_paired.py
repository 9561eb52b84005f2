"""The units of time in which eval_traffic_report.py pairs the arms of eval_traffic.py's
rotation, and the paired statistic over them.

A round holds every arm's window once (their index // the number of arms). A block holds
``rounds_per_block`` consecutive rounds (the windows' recorded ``block``); an arm's tokens/s in a
block is its windows' tokens over their seconds (Σ tokens_per_s × wall_s / Σ wall_s: the
generation-token counter's increase over the windows' wall time), so a stall of the engine that
hits every arm of a block alike scales all of them alike and cancels in the block's ratios.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

Row = dict[str, Any]


def by_round(windows: list[Row]) -> list[dict[str, float]]:
    """Tokens/s of each arm per round (a round: every arm once, in the rotation's order, so
    its windows are close in time)."""
    count = len(set(w["arm"] for w in windows))
    rounds: dict[int, dict[str, float]] = {}
    for w in windows:
        rounds.setdefault(w["index"] // count, {})[w["arm"]] = w["tokens_per_s"]
    return [rounds[r] for r in sorted(rounds)]


def whole_blocks(windows: list[Row], rounds_per_block: int) -> tuple[list[dict[str, float]], int]:
    """Each whole block's tokens/s per arm, in block order, and how many blocks were not
    whole: a block counts only with every arm's ``rounds_per_block`` windows in it (a part
    that failed inside its last block leaves that block unbalanced)."""
    arms = set(w["arm"] for w in windows)
    held: dict[int, dict[str, list[Row]]] = {}
    for w in windows:
        held.setdefault(w["block"], {}).setdefault(w["arm"], []).append(w)
    whole = [
        {arm: sum(w["tokens_per_s"] * w["wall_s"] for w in mine) / sum(w["wall_s"] for w in mine)
         for arm, mine in block.items()}
        for _, block in sorted(held.items())
        if set(block) == arms and all(len(mine) == rounds_per_block for mine in block.values())
    ]  # fmt: skip
    return whole, len(held) - len(whole)


def median_interval(values: list[float], coverage: float = 0.95) -> Row:
    """A distribution-free interval of the median: the order statistics x_(j)..x_(n+1-j) with
    the largest j whose coverage (binomial, p = 1/2) is at least ``coverage``; with too few
    values for that, min..max and the coverage it has (4 values: 87.5 %). Unlike the range, it
    narrows as rounds are added."""
    xs, n = sorted(values), len(values)

    def covered(j: int) -> float:
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(j)) / 2.0**n

    j = 1
    while j < n // 2 and covered(j + 1) >= coverage:
        j += 1
    return {"low": round(xs[j - 1], 4), "high": round(xs[n - j], 4),
            "coverage": round(covered(j), 3)}  # fmt: skip


def sign_test(units: list[dict[str, float]], best: str, other: str) -> Row:
    """In how many units (rounds or blocks) ``best`` made more tokens/s than ``other``, and the
    one-sided sign test's p: the chance of that many or more were the two alike (each unit a
    fair coin). Unlike the range of the ratios, it asks only which is ahead, so a noise that
    moves a unit's ratio a lot but not across 1 does not hide a clear order."""
    pairs = [(u[best], u[other]) for u in units if best in u and other in u]
    ahead, n = sum(b > o for b, o in pairs), len(pairs)
    p = sum(math.comb(n, i) for i in range(ahead, n + 1)) / 2.0**n
    return {"units": n, "best_ahead_in": ahead, "p_one_sided": round(p, 4)}


def paired(units: list[dict[str, float]], arm: str, against: str) -> Row:
    """``arm``'s tokens/s over ``against``'s in the same unit (round or block), per unit:
    their median and range. A slow drift of the machine moves both alike and cancels in the
    ratio; the range of the ratios is the noise that remains."""
    ratios = [u[arm] / u[against] for u in units if arm in u and against in u]
    if not ratios:
        return {"ratios": [], "median_ratio": None, "spread_of_ratios": None,
                "median_ratio_interval": None}  # fmt: skip
    return {
        "ratios": [round(v, 4) for v in ratios],
        "median_ratio": round(statistics.median(ratios), 4),
        "spread_of_ratios": round(max(ratios) - min(ratios), 4),
        "median_ratio_interval": median_interval(ratios),
    }
