"""Re-checks of long shots run sparser once the table has stood (PLUGIN__NEIGHBOUR_RECHECK_*),
and bursts at a measured k are spaced by their price (PLUGIN__NEIGHBOUR_COST_BUDGET), on the
emulator: the bursts' spacing the daemon sets cycle by cycle."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

from bench.live_step_time_sim import daemon_at

AFTER_S = 120.0  # PLUGIN__NEIGHBOUR_RECHECK_AFTER_S's default
CYCLE_S = 15.0  # the emulator run's daemon cycle


def test_long_shots_are_rechecked_sparser_only_once_the_table_has_stood(tmp_path: Path) -> None:
    """serving-decode-heavy at B=192 (k=1 best; the profile's table runs k=3 there), steps
    drawn with a 0.6 spread: the daemon moves to k=1 within two minutes, then keeps going back
    to faded k for a cycle. Those re-checks run a burst every 128 steps, never within 120 s of
    the daemon's start or of a change of the table's k at the load; first looks run every 32.
    Bursts not priced here (budget 0): the re-checks alone."""
    run = daemon_at(192, tmp_path / "run", overrides={"seed": 100, "step_noise": 0.6},
                    horizon_s=600.0, record_cycles=True,
                    PLUGIN__NEIGHBOUR_COST_BUDGET="0")  # fmt: skip
    cycles = run["cycles"]
    assert {c["burst_spacing"] for c in cycles} == {0, 32, 128}
    changed_at = [0.0] + [c["at_s"] for before, c in pairwise(cycles)
                          if c["table_k"] != before["table_k"]]  # fmt: skip
    for cycle in cycles:
        if cycle["burst_spacing"] == 128:  # set at the cycle before, after its table stood
            set_at = cycle["at_s"] - CYCLE_S
            assert all(not 0 <= set_at - t < AFTER_S for t in changed_at), cycle
    assert cycles[-1]["table_k"] == cycles[-1]["best_k"] == 1


def test_rechecks_at_the_neighbour_spacing_when_asked(tmp_path: Path) -> None:
    run = daemon_at(192, tmp_path / "run", overrides={"seed": 100, "step_noise": 0.6},
                    horizon_s=600.0, record_cycles=True,
                    PLUGIN__NEIGHBOUR_RECHECK_INTERVAL="0",
                    PLUGIN__NEIGHBOUR_COST_BUDGET="0")  # fmt: skip
    assert {c["burst_spacing"] for c in run["cycles"]} == {0, 32}


def test_priced_bursts_run_sparser_and_the_table_still_gets_right(tmp_path: Path) -> None:
    """The same run, bursts priced (the default): some cycles' bursts are spaced past the
    re-check interval by what their k lose, always the burst spacing doubled, and the table
    ends on the best k as unpriced."""
    run = daemon_at(192, tmp_path / "run", overrides={"seed": 100, "step_noise": 0.6},
                    horizon_s=600.0, record_cycles=True)  # fmt: skip
    spacings = {c["burst_spacing"] for c in run["cycles"]}
    assert spacings <= {0} | {32 * 2**j for j in range(16)}
    assert max(spacings) > 128
    assert run["cycles"][-1]["table_k"] == run["cycles"][-1]["best_k"] == 1
