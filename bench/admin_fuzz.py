"""10,000 fuzzed admin API requests against the plugin's HTTP side (fake engine through the real
EngineTableController, msgpack-checked utility calls) and the emulator, under each access mode
(a token, the loopback opening, nothing), written to bench/results/admin_fuzz.json.

The requests and the invariants are the test suite's (tests/support/admin_fuzz.py); here they
are counted instead of stopping at the first failure, and drawn afresh from a recorded seed.

    .venv/bin/python bench/admin_fuzz.py                 # 6 x 1,667 requests + the attack set
    .venv/bin/python bench/admin_fuzz.py --seed 12345    # the same draws again
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from hypothesis import settings  # noqa: E402
from tests.support.admin_fuzz import MODES, Tally, run_fuzz  # noqa: E402

from bench.common import environment, write_result  # noqa: E402

PROFILE = "admin-fuzz-10k-random"
KINDS = {  # how judge() words each broken invariant
    "server_errors": "HTTP 5",
    "partial_applies": "refused (",
    "invalid_tables_accepted": "invalid table accepted",
    "writes_against_the_rules": "a write accepted against the rules",
}


def kind_of(violation: str) -> str:
    text = violation.split(": ", 1)[1]
    return next((kind for kind, start in KINDS.items() if text.startswith(start)), "other")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    tallies: dict[str, Tally] = {}
    parity: dict[str, bool] = {}
    started = time.perf_counter()
    for mode in MODES:
        for target in ("plugin", "sim"):
            tally = tallies[f"{target}/{mode}"] = Tally()
            run_fuzz(target, mode, profile=PROFILE, tally=tally, strict=False, random_seed=seed)
        parity[mode] = tallies[f"plugin/{mode}"].answers == tallies[f"sim/{mode}"].answers
    seconds = time.perf_counter() - started
    violations = [v for tally in tallies.values() for v in tally.violations]
    counts = {kind: 0 for kind in [*KINDS, "other"]}
    for violation in violations:
        counts[kind_of(violation)] += 1
    total = sum(t.requests for t in tallies.values())
    payload: dict[str, Any] = {
        "what": "fuzzed admin API requests: plugin HTTP side and emulator, three access modes",
        "command": "python bench/admin_fuzz.py --seed " + str(seed),
        **environment(),
        "hypothesis_profile": PROFILE,
        "examples_per_target": settings.get_profile(PROFILE).max_examples,
        "seed": seed,
        "requests": total,
        **counts,
        "goals": {
            "requests >= 10000": total >= 10_000,
            "no 5xx (the engine is attached)": counts["server_errors"] == 0,
            "no invalid table accepted": counts["invalid_tables_accepted"] == 0,
            "no partial apply": counts["partial_applies"] == 0,
            "emulator answers as the plugin": all(parity.values()),
        },
        "emulator_answers_as_plugin": parity,
        "per_target": {
            name: {
                "requests": t.requests,
                "statuses": {str(s): n for s, n in sorted(t.statuses.items())},
                "accepted_tables": t.accepted_tables,
                "accepted_settings": t.accepted_settings,
            }
            for name, t in tallies.items()
        },
        "violations_first_20": violations[:20],
        "seconds": round(seconds, 1),
    }
    path = write_result("admin_fuzz", payload)
    print(f"{total} requests in {seconds:.0f} s: {counts}; parity {parity}; written to {path}")
    return 0 if not violations and all(parity.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
