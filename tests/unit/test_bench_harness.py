"""The in-process benchmark rig: scenario overrides are validated like the scenario file."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.harness import Rig
from pydantic import ValidationError

from tabletune.sim.scenario import ConstantLoad

PROFILE = Path(__file__).resolve().parents[2] / "examples" / "sample-profile.json"


def test_overrides_replace_the_scenarios_fields(tmp_path: Path) -> None:
    rig = Rig(
        "serving-decode-heavy",
        PROFILE,
        tmp_path,
        overrides={
            "seed": 123,
            "step_noise": 0.6,
            "load": ConstantLoad(kind="constant", batch_size=120),
        },
    )
    assert rig.scenario.seed == 123
    assert rig.scenario.step_noise == 0.6
    assert rig.scenario.load == ConstantLoad(kind="constant", batch_size=120)
    engine = next(iter(rig.replicas.values())).engine
    assert engine.step_noise == 0.6


def test_a_bad_override_is_refused_as_the_file_would_be(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="step_noise"):
        Rig("serving-decode-heavy", PROFILE, tmp_path, overrides={"step_noise": 5.0})
