"""From a scenario and a profile to a running emulated engine (EngineSim + the plugin's engine
side). Benchmarks use ``build_engine`` directly; the server wraps it in a ``Replica``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from tabletune.admin.protocol import SettingsPut, StepCellsRead
from tabletune.admin.state import TableState
from tabletune.errors import InputError
from tabletune.plugin.controller import EngineTableController
from tabletune.schemas import Profile, load_profile
from tabletune.schemas.profile import step_times_of
from tabletune.sim.engine import ChooseK, EngineSim
from tabletune.sim.processes import build_acceptance, build_load, build_traffic
from tabletune.sim.scenario import Scenario
from tabletune.solver import StepTimes


def resolve_profile(scenario: Scenario, base_dir: Path, override: str | Path | None) -> Profile:
    """``--profile`` wins; else the scenario's ``profile`` (relative to the scenario file)."""
    if override is not None:
        return load_profile(override)
    if scenario.profile is None:
        raise InputError(
            f"scenario {scenario.name!r} names no profile: pass --profile PROFILE.json "
            "(e.g. examples/sample-profile.json)"
        )
    path = Path(scenario.profile)
    return load_profile(path if path.is_absolute() else base_dir / path)


def usable_step_times(scenario: Scenario, profile: Profile) -> StepTimes:
    """The profile's step times for k <= K, checked against the scenario's engine."""
    engine = scenario.engine
    big_k = engine.num_speculative_tokens
    times = step_times_of(profile)
    ks = tuple(k for k in times.ks if k <= big_k)
    where = f"scenario {scenario.name!r} with this profile"
    if not ks:
        raise InputError(f"{where}: the profile has no k <= K={big_k}")
    needed = {big_k}
    if engine.starting_table is not None:
        needed |= {min(k, big_k) for _, _, k in engine.starting_table}
    missing = sorted(needed - set(ks))
    if missing:
        raise InputError(
            f"{where}: k {missing} (starting table and K) were not profiled "
            f"(profiled: {list(times.ks)})"
        )
    if engine.max_num_seqs > times.max_batch:
        raise InputError(
            f"{where}: engine.max_num_seqs={engine.max_num_seqs} is beyond the profile's batch "
            f"grid (up to {times.max_batch})"
        )
    rows = [times.ks.index(k) for k in ks]
    return StepTimes(grid=times.grid, ks=ks, ms=np.asarray(times.ms)[rows])


def starting_state(scenario: Scenario) -> TableState:
    """The table state vLLM starts with (settings applied separately, as an operator would)."""
    engine = scenario.engine
    return TableState.initial(
        engine.starting_table,
        num_speculative_tokens=engine.num_speculative_tokens,
        max_num_seqs=engine.max_num_seqs,
    )


def build_engine(
    scenario: Scenario,
    profile: Profile,
    *,
    base_dir: Path,
    seed: int | None = None,
    choose_k: ChooseK | None = None,
    start_s: float = 0.0,
) -> EngineSim:
    """The pure engine; its lookup is the starting table (vLLM's dense list), or ``choose_k``."""
    state = starting_state(scenario)
    return EngineSim(
        step_times=usable_step_times(scenario, profile),
        load=build_load(scenario.load, base_dir),
        acceptance=build_acceptance(scenario.acceptance),
        num_speculative_tokens=scenario.engine.num_speculative_tokens,
        max_num_seqs=scenario.engine.max_num_seqs,
        lookup=list(state.lookup) if state.dynamic else None,
        choose_k=choose_k,
        oracle_ks=sorted(state.allowed_k),
        step_noise=scenario.step_noise,
        seed=scenario.seed if seed is None else seed,
        start_s=start_s,
        truth_interval_s=scenario.truth_interval_s,
        serving=None if scenario.serving is None else scenario.serving.model(),
        traffic=None if scenario.serving is None else build_traffic(scenario.serving.traffic),
    )


def start_engine_side(
    scenario: Scenario,
    engine: EngineSim,
    *,
    read_cells: Callable[[], StepCellsRead] | None = None,
) -> EngineTableController:
    """The plugin's engine side over this engine: it installs lookups into ``engine`` exactly
    as it does into vLLM's scheduler, and decides conditional table PUTs on ``read_cells``
    (the engine's step cells). The scenario's exploration/hysteresis are applied as a
    settings change (version 1), as the daemon or an operator would set them."""
    state = starting_state(scenario)
    engine.install(list(state.lookup) if state.dynamic else None)
    controller = EngineTableController(
        state,
        engine.install,
        identity=scenario.engine.identity(),
        read_cells=read_cells,
    )
    settings = SettingsPut(
        exploration_interval=scenario.engine.exploration_interval or None,
        hysteresis=scenario.engine.hysteresis or None,
    )
    if settings.exploration_interval or settings.hysteresis:
        controller.put_settings(settings.model_dump(exclude_none=True), None)
    return controller
