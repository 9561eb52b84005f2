"""What the demo shows each cycle: a live table in a terminal, one line when output is piped."""

from __future__ import annotations

from typing import Any

from rich.table import Table as RichTable

from tabletune.demo.truth import Timeline


def rates_text(rates: tuple[float, ...] | list[float]) -> str:
    """``(0.750, 0.550, 0.400)``, or ``prior`` before the daemon's first estimate."""
    return "(" + ", ".join(f"{a:.3f}" for a in rates) + ")" if rates else "prior"


def last_goodput_text(truth: dict[str, Any]) -> str | None:
    """The emulator's last 10 s: goodput of the k that ran and its share of the oracle's."""
    intervals = truth.get("intervals") or []
    if not intervals:
        return None
    last = intervals[-1]
    goodput, share = last.get("expected_goodput_tokens_per_s"), last.get("efficiency")
    if goodput is None or share is None:
        return None
    return f"{goodput:,.0f} tok/s, {share:.1%} of the oracle"


def render(truth: dict[str, Any], estimate: tuple[float, ...], timeline: Timeline) -> RichTable:
    view = RichTable(title="TableTune demo: daemon vs ground truth (emulator)", expand=False)
    view.add_column("what", style="bold")
    view.add_column("value")
    loss = truth.get("loss_vs_oracle") or {}
    current = truth.get("current") or {}
    view.add_row("simulated time", f"{truth['sim_time_s']:.0f} s (x{truth['speed']:g})")
    view.add_row("running requests B", str(current.get("batch_size", 0)))
    view.add_row("table (engine)", str(truth.get("table")))
    view.add_row("oracle table", str(truth.get("oracle_table")))
    view.add_row("a_hat (daemon)", rates_text(estimate))
    view.add_row("a (true)", rates_text(truth.get("rates", [])))
    if "table_goodput_tokens_per_s" in current:
        view.add_row(
            "goodput now",
            f"{current['table_goodput_tokens_per_s']:,.0f} tok/s vs oracle "
            f"{current['best_goodput_tokens_per_s']:,.0f} (loss {current['loss']:.1%})",
        )
    if loss:
        view.add_row("worst loss vs oracle, all B", f"{loss['loss']:.1%} at B={loss['batch_size']}")
    measured = last_goodput_text(truth)
    if measured is not None:
        view.add_row("measured, last 10 s", measured)
    view.add_row("pushes", ", ".join(f"{t:.0f} s" for t in timeline.pushes) or "none yet")
    return view


def line(truth: dict[str, Any], estimate: tuple[float, ...], timeline: Timeline) -> str:
    """One cycle as one line (piped output, logs, CI)."""
    current = truth.get("current") or {}
    loss = timeline.worst_loss[-1] if timeline.worst_loss else None
    return (
        f"t={truth['sim_time_s']:5.0f}s B={current.get('batch_size', 0):3d} "
        f"table={truth.get('table')} a_hat={rates_text(estimate)} "
        f"goodput {last_goodput_text(truth) or 'n/a'} (last 10 s); "
        f"worst loss over all B {'n/a' if loss is None else f'{loss:.1%}'}"
    )
