"""Profiles and pools: replicas matched by model name, clear errors for missing priors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tabletune.daemon.profiles import load_pools, make_pool, pool_for
from tabletune.daemon.settings import load_settings
from tabletune.errors import InputError
from tabletune.schemas import save_model
from tests.unit.daemon_fakes import small_profile


def test_single_profile_fits_every_replica() -> None:
    pool = make_pool(small_profile(), None)
    assert pool_for([pool], "anything") is pool
    assert pool.t_ms(16, 2) == pytest.approx(pool.step_times.at(16, 2))
    assert pool.t_ms(10_000, 0) == pytest.approx(pool.step_times.at(128, 0))  # clamped


def test_pools_by_model_name(tmp_path: Path) -> None:
    a = small_profile()
    b = a.model_copy(update={"metadata": a.metadata.model_copy(update={"model": "other"})})
    paths = []
    for name, profile in (("a", a), ("b", b)):
        path = tmp_path / f"{name}.json"
        save_model(profile, path)
        paths.append(str(path))
    settings = load_settings({"TABLETUNE_PROFILE__PATHS": ",".join(paths)}).profile
    pools = load_pools(settings)
    assert pool_for(pools, "other") is pools[1]
    assert pool_for(pools, "m") is pools[0]
    assert pool_for(pools, "unknown") is None


def test_missing_prior_and_paths_are_clear_errors() -> None:
    bare = small_profile().model_copy(update={"acceptance": None})
    with pytest.raises(InputError, match="no acceptance prior"):
        make_pool(bare, None)
    with pytest.raises(InputError, match="TABLETUNE_PROFILE__PATHS"):
        load_pools(load_settings({}).profile)
