"""The serving model's maths: named cases worked by hand, then properties (hypothesis) and the
closed-form expectation against the emulator's own per-step draws (Monte Carlo)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune.sim.draws import PrefillStream
from tabletune.sim.scenario import load_scenario, traffic_shapes
from tabletune.sim.serving import (
    Lengths,
    ServingModel,
    TrafficShape,
    arrival_tokens,
    chunked_prefill,
    poisson_cdf,
)
from tabletune.solver import tau

MODEL = ServingModel(graph_limit_tokens=512, graph_miss_factor=1.8, prefill_s_per_token=8e-6)
RATES = (0.75, 0.55, 0.4)


def shape(prompt: Lengths, output: Lengths) -> TrafficShape:
    return TrafficShape("test", prompt, output)


def miss_above(model: ServingModel, decode_tokens: int) -> float:
    return float(model.miss_above(np.array([decode_tokens]))[0])


# -- named cases, worked by hand ---------------------------------------------------------------


def test_prefill_riding_along_under_and_over_the_graph_limit() -> None:
    # B=128, k=2: 384 decode tokens, so 128 prefill tokens still fit the 512-token graphs.
    above = miss_above(MODEL, 128 * 3)
    assert above == 128
    assert MODEL.step_seconds(0.010, 100, above) == pytest.approx(0.010 + 100 * 8e-6)
    assert MODEL.step_seconds(0.010, 128, above) == pytest.approx(0.010 + 128 * 8e-6)
    assert MODEL.step_seconds(0.010, 200, above) == pytest.approx((0.010 + 200 * 8e-6) * 1.8)


def test_pure_decode_above_the_limit_misses_unless_the_profile_holds_it() -> None:
    # B=150, k=3: 600 decode tokens, over the limit with no prefill at all.
    assert MODEL.step_seconds(0.010, 0, miss_above(MODEL, 600)) == pytest.approx(0.018)
    measured = ServingModel(graph_misses_in_profile=True)
    assert miss_above(measured, 600) == math.inf
    assert measured.step_seconds(0.010, 0, miss_above(measured, 600)) == 0.010
    assert miss_above(measured, 384) == 128  # below the limit the profile ran in the graphs


def test_mean_context_and_context_factor() -> None:
    # Prompt 100 tokens, output 500: a running request has generated 250 on average.
    fixed = shape(Lengths.constant(100), Lengths.constant(500))
    assert fixed.mean_context == pytest.approx(350.0)
    model = ServingModel(context_cost=0.3, context_ref_tokens=350)
    assert model.context_factor(fixed) == pytest.approx(1.3)
    # Outputs 1, 2 or 3: longer requests stay longer, E[O^2] / (2 E[O]) = (14/3) / 4.
    mixed = shape(Lengths.constant(10), Lengths.uniform(1, 3))
    assert mixed.mean_context == pytest.approx(10 + 7 / 6)


def test_attention_reads_each_context_once_a_step_at_every_k_and_outside_the_graphs() -> None:
    # Decode attention reads each request's KV cache once a step for all its 1 + k positions
    # (bandwidth-bound): B=100 requests with 3,000 tokens of context at 0.04 us a token cost
    # 12 ms a step, whatever k, and a graph miss (launch overhead) does not scale it.
    fixed = shape(Lengths.constant(2900), Lengths.constant(200))
    assert fixed.mean_context == pytest.approx(3000.0)
    model = ServingModel(attention_s_per_context_token=0.04e-6)
    assert model.attention_seconds(100.0, fixed) == pytest.approx(0.012)
    assert ServingModel().attention_seconds(100.0, fixed) == 0.0
    above = miss_above(model, 128 * 3)
    assert model.step_seconds(0.010, 100, above, 0.012) == pytest.approx(0.010 + 100 * 8e-6 + 0.012)
    missed = (0.010 + 200 * 8e-6) * 1.8 + 0.012
    assert model.step_seconds(0.010, 200, above, 0.012) == pytest.approx(missed)
    lam = 0.5
    plain, charged = (
        model.expected_step_seconds(
            np.array([0.010]), np.array([lam]), np.array([above]), fixed, np.array([a])
        )[0]
        for a in (0.0, 0.012)
    )
    assert charged - plain == pytest.approx(0.012, rel=1e-12)


def test_closed_loop_arrivals_per_step() -> None:
    # 128 requests produce 128 * tau(2) = 294.4 tokens per step; outputs of 400 tokens.
    fixed = shape(Lengths.constant(200), Lengths.constant(400))
    assert tau(RATES, 2) == pytest.approx(2.3)
    assert fixed.arrivals_per_step(128.0, tau(RATES, 2)) == pytest.approx(0.736)


def test_expected_step_time_with_one_prompt_length() -> None:
    # Prompts of 200 tokens at B=128, k=2 (room 128): any arrival leaves the graphs, so
    # E[T] = base + c E[p] + 0.8 (base P(N >= 1) + c E[p]) with N ~ Poisson(0.736).
    fixed = shape(Lengths.constant(200), Lengths.constant(400))
    lam = 0.736
    base, c = 0.010, 8e-6
    mean_prefill = lam * 200
    hand = base + c * mean_prefill + 0.8 * (base * (1 - math.exp(-lam)) + c * mean_prefill)
    found = MODEL.expected_step_seconds(np.array([base]), np.array([lam]), np.array([128.0]), fixed)
    assert found[0] == pytest.approx(hand, rel=1e-12)
    assert hand == pytest.approx(0.01628748, rel=1e-6)


def test_expected_step_time_with_two_prompts_fitting_the_graphs() -> None:
    # Prompts of 50 tokens, room 128: up to 2 arrivals stay under the limit.
    fixed = shape(Lengths.constant(50), Lengths.constant(400))
    lam, base, c = 0.5, 0.010, 8e-6
    p = [math.exp(-lam) * lam**n / math.factorial(n) for n in range(3)]
    under, under_mass = sum(p), 50 * p[1] + 100 * p[2]
    hand = base + c * lam * 50 + 0.8 * (base * (1 - under) + c * (lam * 50 - under_mass))
    found = MODEL.expected_step_seconds(np.array([base]), np.array([lam]), np.array([128.0]), fixed)
    assert found[0] == pytest.approx(hand, rel=1e-12)


def test_lengths() -> None:
    assert Lengths.constant(7).mean == 7 and Lengths.constant(7).maximum == 7
    four = Lengths.uniform(1, 4)
    assert four.mean == 2.5 and four.mean_square == pytest.approx(7.5)
    assert list(four.sample(np.array([0.0, 0.24, 0.26, 0.99]))) == [1, 1, 2, 4]
    assert list(Lengths.uniform(3, 3).sample(np.array([0.0, 0.5]))) == [3, 3]
    # Rounded lognormal: half the mass at or below the median; what lies beyond max piles up
    # on max (here max = median: half of it).
    wide = Lengths.lognormal(100, 1.0, 100_000)
    assert wide.cdf[100] == pytest.approx(0.5, abs=0.003)
    clipped = Lengths.lognormal(100, 1.0, 100)
    assert clipped.pmf[100] == pytest.approx(0.5, abs=0.003)
    assert clipped.pmf.sum() == pytest.approx(1.0)


def test_arrival_tokens_and_chunked_prefill() -> None:
    assert list(arrival_tokens(np.array([0, 2, 1]), np.array([5, 7, 11]))) == [0, 12, 11]
    # Budget 7000: the 9000 of step 2 spill 2000 into step 3.
    served, backlog = chunked_prefill(np.array([5000, 9000, 0, 100]), 7000, 0)
    assert list(served) == [5000, 7000, 2000, 100]
    assert list(backlog) == [0, 2000, 0, 0]
    served, backlog = chunked_prefill(np.array([5000, 9000, 0, 100]), 7000, 3000)
    assert list(served) == [7000, 7000, 3000, 100]
    assert list(backlog) == [1000, 3000, 0, 0]


def test_poisson_cdf() -> None:
    cdf = poisson_cdf(0.736)
    assert cdf[0] == pytest.approx(math.exp(-0.736))
    assert cdf[1] == pytest.approx(math.exp(-0.736) * 1.736)
    assert cdf[-1] == pytest.approx(1.0)
    assert poisson_cdf(5000.0)[5000] == pytest.approx(0.5, abs=0.01)  # no underflow


# -- properties --------------------------------------------------------------------------------

lengths = st.one_of(
    st.integers(1, 3000).map(Lengths.constant),
    st.tuples(st.integers(1, 500), st.integers(0, 2000)).map(
        lambda t: Lengths.uniform(t[0], t[0] + t[1])
    ),
    st.tuples(st.floats(1, 1500), st.floats(0.05, 2.0), st.integers(0, 4000)).map(
        lambda t: Lengths.lognormal(t[0], t[1], math.ceil(t[0]) + t[2])
    ),
)
models = st.builds(
    ServingModel,
    graph_limit_tokens=st.integers(64, 1024),
    graph_miss_factor=st.floats(1.0, 4.0),
    graph_misses_in_profile=st.booleans(),
    prefill_s_per_token=st.floats(0.0, 5e-5),
)


@given(
    model=models,
    base=st.floats(1e-4, 0.1),
    decode=st.integers(1, 2048),
    prefill=st.lists(st.integers(0, 8192), min_size=2, max_size=2).map(sorted),
)
def test_step_time_is_positive_and_grows_with_prefill_and_misses_only_above_the_limit(
    model: ServingModel, base: float, decode: int, prefill: list[int]
) -> None:
    above = miss_above(model, decode)
    less, more = (model.step_seconds(base, p, above) for p in prefill)
    assert 0 < less <= more
    for p, seconds in zip(prefill, (less, more), strict=True):
        plain = base + model.prefill_s_per_token * p
        if decode + p <= model.graph_limit_tokens:
            assert seconds == plain
        elif not (model.graph_misses_in_profile and decode > model.graph_limit_tokens):
            assert seconds == pytest.approx(plain * model.graph_miss_factor)


def draw_prefill(
    model: ServingModel, traffic: TrafficShape, batch: int, k: int, steps: int
) -> tuple[np.ndarray, np.ndarray]:
    """Prefill tokens per step as the emulator draws them at one (B, k), and the tokens that
    arrived for each step (what it would carry without a budget)."""
    stream = PrefillStream(np.random.default_rng(1), np.random.default_rng(2))
    lam = traffic.arrivals_per_step(float(batch), tau(RATES, k))
    budget = model.prefill_budget(batch * (1 + k))
    served, _, backlog = stream.ahead(steps, poisson_cdf(lam), traffic, budget)
    arrived = served + np.diff(backlog, prepend=0)
    assert np.all(served >= 0) and np.all(arrived >= 0)
    return served, arrived


def expected_seconds(
    model: ServingModel, traffic: TrafficShape, batch: int, k: int, base: float
) -> float:
    lam = traffic.arrivals_per_step(float(batch), tau(RATES, k))
    above = miss_above(model, batch * (1 + k))
    found = model.expected_step_seconds(
        np.array([base]), np.array([lam]), np.array([above]), traffic
    )
    return float(found[0])


@settings(max_examples=25, deadline=None)
@given(
    model=models,
    prompt=lengths,
    output=lengths,
    batch=st.integers(1, 256),
    k=st.integers(0, 3),
)
def test_expected_step_time_matches_the_draws(
    model: ServingModel, prompt: Lengths, output: Lengths, batch: int, k: int
) -> None:
    traffic = shape(prompt, output)
    lam = traffic.arrivals_per_step(float(batch), tau(RATES, k))
    # Only traffic the engine can keep up with (scenarios refuse the rest), with margin.
    if lam * prompt.mean > 0.5 * model.prefill_budget(batch * (1 + k)):
        return
    served, _ = draw_prefill(model, traffic, batch, k, 100_000)
    draws = model.step_seconds(0.01, served, miss_above(model, batch * (1 + k)))
    expected = expected_seconds(model, traffic, batch, k, 0.01)
    error = draws.std() / math.sqrt(draws.size)
    # Events rarer than ~1/n may not show in n draws at all (then the sample has no spread
    # for them): allow them 5/n of the largest step-time excursion.
    room = model.prefill_budget(batch * (1 + k))
    longest = (0.01 + model.prefill_s_per_token * room) * model.graph_miss_factor
    unseen = 5 / draws.size * (longest - 0.01)
    assert abs(draws.mean() - expected) <= 5 * error + unseen + 1e-9 * expected


@pytest.mark.parametrize(
    ("batch", "k"), [(32, 0), (64, 3), (128, 1), (128, 3), (170, 2), (200, 0), (256, 1)]
)
def test_the_budget_moves_the_expectation_of_the_packaged_shapes_by_far_less_than_half_a_percent(
    batch: int, k: int
) -> None:
    """The closed form is exact for steps whose arrivals are served at once; the budget
    (chunked prefill) delays some prompt tokens, which can move a step across the graph limit.
    Its effect on E[T] is (m - 1) E[h(arrived) - h(served)], h(p) = (base + c p) 1{p <= room}
    (E[served] = E[arrived]): drawn, it is below 0.05 %; and the closed form matches the
    drawn step times within sampling error."""
    scenario, _ = load_scenario("shape-change")
    assert scenario.serving is not None
    model = scenario.serving.model()
    base, above = 0.01, miss_above(model, batch * (1 + k))
    for spec in traffic_shapes(scenario.serving.traffic):
        traffic = spec.shape()
        served, arrived = draw_prefill(model, traffic, batch, k, 200_000)
        expected = expected_seconds(model, traffic, batch, k, base)

        def under(p: np.ndarray) -> np.ndarray:
            result: np.ndarray = (base + model.prefill_s_per_token * p) * (p <= above)
            return result

        moved = (model.graph_miss_factor - 1.0) * (under(arrived) - under(served))
        bound = abs(moved.mean()) + 4 * moved.std() / math.sqrt(moved.size)
        assert bound < 0.0005 * expected, spec.name
        draws = model.step_seconds(base, served, above)
        error = draws.std() / math.sqrt(draws.size)
        assert abs(draws.mean() - expected) <= 5 * error, spec.name
