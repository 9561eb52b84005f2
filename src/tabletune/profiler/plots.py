"""The profile's pictures: heatmap of T(B, k), goodput per k vs B, the chosen k per B."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
import numpy as np

from tabletune.schemas.profile import Profile, step_times_of
from tabletune.solver import Solution, goodput_matrix


def _title(profile: Profile) -> str:
    meta = profile.metadata
    drafter = f" + {Path(meta.drafter).name}" if meta.drafter else ""
    model = Path(meta.model).name
    return f"{meta.gpu} · {model}{drafter} · {meta.method} K={meta.num_speculative_tokens}"


def heatmap(profile: Profile, path: Path) -> None:
    matrix = profile.step_matrix()
    noisy = {(c.batch_size, c.k) for c in profile.cells if c.noisy}
    width = max(8.0, 0.22 * len(profile.batch_grid))
    fig, ax = plt.subplots(figsize=(width, 1.2 + 0.6 * len(profile.ks)))
    image = ax.imshow(matrix, aspect="auto", cmap="viridis", origin="lower")
    ax.set_yticks(range(len(profile.ks)), [str(k) for k in profile.ks])
    ticks = list(range(0, len(profile.batch_grid), max(1, len(profile.batch_grid) // 24)))
    ax.set_xticks(ticks, [str(profile.batch_grid[i]) for i in ticks], rotation=90)
    for col, b in enumerate(profile.batch_grid):
        for row, k in enumerate(profile.ks):
            if (b, k) in noisy:
                ax.text(col, row, "!", ha="center", va="center", color="red", fontweight="bold")
    ax.set_xlabel("batch size B (grid index)")
    ax.set_ylabel("k")
    ax.set_title(f"step time T(B,k) ms ('!' = noisy, kept as measured)\n{_title(profile)}")
    fig.colorbar(image, ax=ax, label="ms")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def goodput_plot(profile: Profile, rates: Sequence[float], path: Path) -> None:
    times = step_times_of(profile)
    g = goodput_matrix(times, rates, times.max_batch)
    batch = np.arange(1, times.max_batch + 1)
    fig, ax = plt.subplots(figsize=(9, 5))
    for row, k in enumerate(times.ks):
        ax.plot(batch, g[row] * 1000.0, label=f"k={k}")
    ax.set_xlabel("batch size B")
    ax.set_ylabel("goodput (kept tokens/s)")
    shown = ", ".join(f"{a:.2f}" for a in rates)
    ax.set_title(f"goodput per k, a=({shown})\n{_title(profile)}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def chosen_k_plot(profile: Profile, solution: Solution, path: Path) -> None:
    batch = np.arange(1, solution.max_batch + 1)
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.step(batch, solution.per_batch_k, where="mid", label="table (sticky)")
    ax.plot(batch, solution.best_k, ".", markersize=3, alpha=0.5, label="argmax k")
    ax.set_xlabel("batch size B")
    ax.set_ylabel("k")
    ax.set_yticks(sorted(solution.allowed_k))
    table = ", ".join(f"[{s},{e},{k}]" for s, e, k in solution.ranges)
    ax.set_title(f"chosen k per B: {table}\n{_title(profile)}", fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
