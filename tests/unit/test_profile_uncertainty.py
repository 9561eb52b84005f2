"""A profile's step-time uncertainty per cell (from its raw samples) and dense over 1..max_B."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.schemas import load_profile
from tabletune.schemas.profile import Cell, uncertainty_of
from tests.unit.references import H200, profile_of

MAD_TO_SIGMA = 1.4826  # a normal distribution's sigma per median absolute deviation


def cell(samples: tuple[float, ...], *, noisy: bool = False, b: int = 1, k: int = 0) -> Cell:
    return Cell(
        batch_size=b,
        k=k,
        samples_ms=samples,
        step_ms=float(np.median(samples)),
        noisy=noisy,
    )


def test_spread_over_root_n_and_a_noisy_cell_keeps_its_whole_spread() -> None:
    # median 10, median absolute deviation 1
    assert cell((9.0, 10.0, 11.0)).relative_sigma == pytest.approx(MAD_TO_SIGMA / 10 / math.sqrt(3))
    assert cell((9.0, 10.0, 11.0), noisy=True).relative_sigma == pytest.approx(MAD_TO_SIGMA / 10)


def test_one_sample_says_nothing_about_spread() -> None:
    assert cell((7.0,)).relative_sigma == 0.0


@given(
    st.lists(st.floats(1.0, 50.0), min_size=3, max_size=12),
    st.floats(100.0, 1000.0),
)
def test_one_wild_sample_barely_moves_the_spread(samples: list[float], spike: float) -> None:
    wild_samples = (*samples, spike)
    wild = cell(wild_samples, noisy=True).relative_sigma * float(np.median(wild_samples))
    assert wild <= MAD_TO_SIGMA * (max(samples) - min(samples)) + 1e-9


def test_dense_uncertainty_is_interpolated_like_t() -> None:
    cells = (
        cell((9.0, 10.0, 11.0), b=1),
        cell((18.0, 20.0, 22.0), b=5),
        cell((9.0, 10.0, 11.0), noisy=True, b=1, k=1),
        cell((10.0,), b=5, k=1),
    )
    profile = profile_of(cells)
    on_grid = profile.uncertainty_matrix()
    assert on_grid[0].tolist() == pytest.approx([cells[0].relative_sigma, cells[1].relative_sigma])
    dense = uncertainty_of(profile, 5)
    assert dense.shape == (2, 5)
    # k=1: the noisy cell's whole spread at B=1, exact at B=5, linear between
    assert dense[1].tolist() == pytest.approx(np.linspace(MAD_TO_SIGMA / 10, 0.0, 5).tolist())


def test_the_noisy_h200_cell_at_128_is_as_uncertain_as_its_spread() -> None:
    profile = load_profile(H200)
    (noisy,) = [c for c in profile.cells if (c.batch_size, c.k) == (128, 2)]
    (steady,) = [c for c in profile.cells if (c.batch_size, c.k) == (128, 3)]
    assert noisy.noisy and not steady.noisy
    assert noisy.relative_sigma > 0.03 > 0.01 > steady.relative_sigma
    dense = uncertainty_of(profile, 256)
    assert dense[profile.ks.index(2), 127] == pytest.approx(noisy.relative_sigma)
