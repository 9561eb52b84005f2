"""The Nightjar-style policy in the emulator and in the plugin, step for step: the emulator's
steps replayed through the plugin's ``update_from_output`` wrapper (stand-in vLLM) make the
plugin's bandit choose the very k the emulator's chose, and learn from the same steps."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tabletune.plugin.bandit import NightjarLookup
from tabletune.plugin.engine import build_controller
from tabletune.schemas import load_profile
from tabletune.sim.build import build_engine, start_engine_side
from tabletune.sim.engine import StepBatch
from tabletune.sim.scenario import parse_scenario

from .test_plugin_engine_glue import clocked_scheduler, output

REPO = Path(__file__).resolve().parents[2]
START = [[1, 16, 3], [17, 32, 1], [33, 256, 0]]
SETTINGS = {"policy": "nightjar", "nightjar_exploration": 0.4}


def emulated_steps(seconds: float) -> tuple[list[StepBatch], NightjarLookup]:
    """The emulator under a load that moves across batch sizes, the bandit on."""
    scenario = parse_scenario(
        {
            "name": "parity",
            "engine": {"num_speculative_tokens": 3, "max_num_seqs": 256, "starting_table": START},
            "load": {"kind": "sweep", "batch_sizes": [6, 40, 7, 120], "dwell_s": seconds / 4},
            "acceptance": {"kind": "constant", "rates": [0.5, 0.3, 0.1]},
            "step_noise": 0.1,
        },
        source="parity",
    )
    profile = load_profile(REPO / "examples" / "sample-profile.json")
    engine = build_engine(scenario, profile, base_dir=REPO, seed=3)
    controller = start_engine_side(scenario, engine)
    assert controller.put_settings(SETTINGS, None)["status"] == 200
    steps: list[StepBatch] = []
    engine.on_steps.append(steps.append)
    engine.advance(seconds)
    assert isinstance(engine.lookup, NightjarLookup)
    return steps, engine.lookup


def plugin_scheduler(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[float]]:
    """The stand-in vLLM scheduler, wrapped by the plugin, its controller built over it."""
    scheduler, clock = clocked_scheduler(monkeypatch)
    scheduler.num_spec_tokens = 3
    scheduler.scheduler_config = SimpleNamespace(max_num_seqs=256)
    spec = SimpleNamespace(num_speculative_tokens_per_batch_size=START)
    config = SimpleNamespace(
        speculative_config=spec, model_config=SimpleNamespace(served_model_name="m")
    )
    controller = build_controller(
        SimpleNamespace(scheduler=scheduler, vllm_config=config), engine_version="0.26.0"
    )
    assert controller.put_settings(SETTINGS, None)["status"] == 200
    return scheduler, clock


def test_the_plugin_chooses_and_learns_as_the_emulator_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps, emulated = emulated_steps(8.0)
    assert len(steps) > 500 and {s.batch_size for s in steps} == {6, 7, 40, 120}
    scheduler, clock = plugin_scheduler(monkeypatch)
    bandit = scheduler.dynamic_sd_lookup
    assert isinstance(bandit, NightjarLookup)
    # vLLM's first timed call only starts the clock (the emulator's first step is timed): a
    # prefill-only step ahead of the replay lines the two up.
    prefill = SimpleNamespace(
        num_scheduled_tokens={"p": 512},
        total_num_scheduled_tokens=512,
        scheduled_spec_decode_tokens={},
        num_spec_tokens_to_schedule=0,
    )
    scheduler.update_from_output(prefill, SimpleNamespace(sampled_token_ids=[[]]))
    now = clock[0]
    # An emulator step's k is the lookup's read for it: the drafts it makes (which its time
    # follows); in vLLM the step verifies the drafts of the step before.
    verified = int(steps[0].ks[0])
    for step in steps:
        batch, k = step.batch_size, int(step.ks[0])
        assert bandit[batch] == k  # the scheduler's read: the same choice
        now += float(step.durations_s[0])
        clock[0] = now
        kept = [[0]] * (batch - 1) + [[0] * (step.tokens - batch + 1)]
        scheduler.update_from_output(
            output(batch, verified, drafts_next=k), SimpleNamespace(sampled_token_ids=kept)
        )
        verified = k
    assert bandit.steps == emulated.steps == len(steps)
    assert bandit.rewarded_steps == emulated.rewarded_steps
    assert [bandit.table_k(b) for b in (6, 7, 40, 120)] == [
        emulated.table_k(b) for b in (6, 7, 40, 120)
    ]
