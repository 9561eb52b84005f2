"""The demo's PNG: the load, goodput against the oracle, and a_hat against the true a_i."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tabletune.demo.truth import Timeline

NAN = float("nan")


def plot(timeline: Timeline, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (load, share, rates) = plt.subplots(
        3, 1, figsize=(10, 7.5), sharex=True, height_ratios=(1, 2, 2), layout="constrained"
    )
    t = timeline.sim_s
    load.step(t, timeline.load, where="post", color="black", label="running requests B")
    load.set_ylabel("B")
    load.set_title("TableTune daemon on the emulator (dotted: table pushes)")
    eff = [NAN if e is None else 100 * e for e in timeline.efficiency]
    worst = [NAN if w is None else 100 * w for w in timeline.worst_loss]
    share.plot(t, eff, label="measured goodput / oracle,\nlast 10 s (%)")
    share.plot(t, worst, label="worst loss vs oracle\nover all B (%)")
    share.set_ylabel("%")
    positions = max((len(e) for e in timeline.estimate), default=0)
    for i in range(positions):
        estimate = [e[i] if len(e) > i else NAN for e in timeline.estimate]
        (drawn,) = rates.plot(t, estimate, label=f"a_hat_{i + 1}")
        truth = [r[i] if len(r) > i else NAN for r in timeline.truth]
        rates.plot(t, truth, linestyle="--", color=drawn.get_color(), label=f"a_{i + 1} (true)")
    rates.set_xlabel("simulated time (s)")
    rates.set_ylabel("acceptance")
    for axis in (load, share, rates):
        for push in timeline.pushes:
            axis.axvline(push, color="grey", linestyle=":", linewidth=1)
        _legend_outside(axis)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _legend_outside(axis: Any) -> None:
    """Right of the axes, never over a line."""
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
