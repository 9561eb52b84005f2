"""Profiles the daemon works from, and which pool (profile) each replica belongs to.

A pool is the replicas sharing one profile: same model, drafter and GPU. A replica is matched to
the profile whose model name equals the one it reports; with a single profile, every replica
uses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tabletune.daemon.settings import ProfileSettings
from tabletune.errors import InputError
from tabletune.schemas import AcceptanceProfile, Profile, load_acceptance, load_profile
from tabletune.schemas.profile import step_times_of, uncertainty_of
from tabletune.solver import StepTimes


@dataclass(frozen=True)
class PoolProfile:
    """One profile ready for the solver, with its prior and a stable pool name."""

    name: str
    profile: Profile
    step_times: StepTimes
    prior: tuple[float, ...]
    dense_ms: np.ndarray = field(init=False, repr=False, compare=False)
    relative_sigma: np.ndarray = field(init=False, repr=False, compare=False)
    off_graph: np.ndarray = field(init=False, repr=False, compare=False)
    _rows: dict[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # T and its relative uncertainty for every B of the grid's range, once.
        top = self.step_times.max_batch
        object.__setattr__(self, "dense_ms", self.step_times.dense(top))
        object.__setattr__(self, "relative_sigma", uncertainty_of(self.profile, top))
        object.__setattr__(self, "off_graph", self.profile.off_graph_matrix())
        object.__setattr__(self, "_rows", {k: i for i, k in enumerate(self.step_times.ks)})

    @property
    def capture_limit(self) -> int | None:
        """The engine's largest full CUDA graph in tokens, where the profile says."""
        graphs = self.profile.metadata.cuda_graphs
        return None if graphs is None else graphs.max_capture_size

    @property
    def model(self) -> str:
        return self.profile.metadata.model

    def t_ms(self, batch_size: int, k: int) -> float:
        """Profile T(B, k) in ms; B is clamped to 1..max profiled (KeyError for unprofiled k)."""
        column = min(max(1, batch_size), self.step_times.max_batch) - 1
        return float(self.dense_ms[self._rows[k], column])


def pool_name(profile: Profile) -> str:
    meta = profile.metadata
    return f"{meta.model}|{meta.drafter or meta.method}|{meta.gpu}"


def make_pool(profile: Profile, acceptance: AcceptanceProfile | None) -> PoolProfile:
    prior = acceptance or profile.acceptance
    if prior is None:
        raise InputError(
            f"profile {pool_name(profile)} has no acceptance prior: measure one with the "
            "profiler or set TABLETUNE_PROFILE__ACCEPTANCE_PATH"
        )
    if prior.max_k < profile.ks[-1]:
        raise InputError(
            f"acceptance prior has {prior.max_k} rates; the profile goes up to k={profile.ks[-1]}"
        )
    return PoolProfile(
        name=pool_name(profile),
        profile=profile,
        step_times=step_times_of(profile),
        prior=tuple(prior.rates),
    )


def load_pools(settings: ProfileSettings) -> tuple[PoolProfile, ...]:
    """Load every configured profile (InputError naming the file on any problem)."""
    if not settings.paths:
        raise InputError("TABLETUNE_PROFILE__PATHS: no profile given (a profile JSON file)")
    acceptance = (
        load_acceptance(settings.acceptance_path) if settings.acceptance_path is not None else None
    )
    pools = tuple(make_pool(load_profile(path), acceptance) for path in settings.paths)
    names = [pool.name for pool in pools]
    if len(set(names)) != len(names):
        raise InputError(f"TABLETUNE_PROFILE__PATHS: two profiles for the same pool: {names}")
    return pools


def pool_for(pools: Sequence[PoolProfile], model_name: str | None) -> PoolProfile | None:
    """The replica's pool: a single profile fits all; otherwise match the model name."""
    if len(pools) == 1:
        return pools[0]
    for pool in pools:
        if model_name is not None and pool.model == model_name:
            return pool
    return None
