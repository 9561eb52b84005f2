"""SIGKILL in the middle of state writes never leaves a broken state file."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tabletune.daemon.state import StateStore

WRITER = """
import sys
from pathlib import Path
from tabletune.daemon.state import DaemonState, StateStore, UnitRecord

store = StateStore(Path(sys.argv[1]))
n = 0
while True:
    n += 1
    units = {
        f"replica-{i}": UnitRecord(prior=(0.8, 0.6, 0.4), weight=2000.0,
                                   drafted=(float(n),) * 3, accepted=(float(n) / 2,) * 3,
                                   rates=(0.8, 0.6, 0.4), rebuilds=n)
        for i in range(400)
    }
    store.save(DaemonState(saved_at=float(n), units=units))
    if n == 1:
        print("first", flush=True)
"""


@pytest.mark.integration
def test_sigkill_during_writes_leaves_old_or_new_state(tmp_path: Path) -> None:
    last_seen = 0.0
    for round_ in range(6):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert writer.stdout is not None
            assert writer.stdout.readline().strip() == b"first"
            # Each write takes a few ms: kill at different points of the write cycle.
            time.sleep(0.05 + 0.037 * round_)
            writer.send_signal(signal.SIGKILL)
        finally:
            writer.wait(timeout=10)
        state, problem = StateStore(tmp_path).load()
        assert problem is None, problem
        assert state.saved_at >= 1.0
        assert len(state.units) == 400
        unit = state.units["replica-0"]
        assert unit.drafted == (state.saved_at,) * 3  # one whole write, never a mix
        last_seen = state.saved_at
    assert last_seen >= 1.0
    assert not list(tmp_path.glob("daemon-state.json.bad-*"))
    # Killed writers may leave temp files; loading cleans them up.
    assert not list(tmp_path.glob(".daemon-state.json.*"))
