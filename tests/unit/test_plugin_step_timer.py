"""The engine-side step clock on fake scheduler outputs: which steps count, their k, B, time."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.plugin.step_timer import StepTimer
from tabletune.step_cells import CellTotals, cell_key


@dataclass
class Step:
    """What the timer reads of one ``SchedulerOutput`` (plus the clock and the idle flag)."""

    tokens: dict[str, int]
    spec: dict[str, list[int]] = field(default_factory=dict)
    idle_after: bool = False
    drafts_next: int | None = None  # None: as many as it verified (a steady step)

    @property
    def total(self) -> int:
        return sum(self.tokens.values())

    @property
    def k(self) -> int:
        return max(map(len, self.spec.values()), default=0)


def decode(batch: int, k: int, *, prefill: int = 0) -> Step:
    """``batch`` decode requests verifying ``k`` drafts, plus one prefill of ``prefill`` tokens."""
    tokens = {f"d{i}": 1 + k for i in range(batch)}
    spec = {f"d{i}": [-1] * k for i in range(batch)} if k else {}
    if prefill:
        tokens["p"] = prefill
    return Step(tokens, spec)


def run(steps: list[tuple[float, Step]], timer: StepTimer | None = None) -> StepTimer:
    timer = timer or StepTimer(started_at=1000.0)
    for now, step in steps:
        drafts_next = step.k if step.drafts_next is None else step.drafts_next
        timer.on_step(
            now, step.tokens, step.total, step.spec,
            idle_after=step.idle_after, drafts_next=drafts_next,
        )  # fmt: skip
    return timer


def test_back_to_back_steps_count_the_time_since_the_previous_call() -> None:
    timer = run([(0.0, decode(4, 3)), (0.25, decode(4, 3)), (0.75, decode(4, 3))])
    cells = timer.counter.totals()
    assert cells == {cell_key(3, 4): CellTotals(2, 0.75, 0.25**2 + 0.5**2, 32, 8)}


def test_a_step_drafting_another_k_than_it_verified_is_a_switch_not_in_a_cell() -> None:
    # A k=3 burst inside k=0's run, as vLLM's async scheduling runs it (H200, B≈254,
    # bench/results/step_trace_decode_heavy_h200.json): the step that verifies 0 and drafts 3
    # takes as long as a k=3 step (40 ms), the one that verifies 3 and drafts 0 near a k=0 one.
    plan = [(0, 0, 0.014), (0, 0, 0.014), (0, 3, 0.040), (3, 3, 0.040), (3, 3, 0.040),
            (3, 3, 0.040), (3, 0, 0.016), (0, 0, 0.014), (0, 0, 0.014)]  # fmt: skip
    steps, now = [], 0.0
    for verified, drafted, seconds in plan:
        now += seconds
        step = decode(250, verified)
        step.drafts_next = drafted
        steps.append((now, step))
    timer = run(steps)
    cells = timer.counter.totals()
    assert cells[cell_key(0, 250)].seconds == pytest.approx(3 * 0.014)  # not the 40-ms step
    assert cells[cell_key(3, 250)].steps == 3
    assert cells[cell_key(3, 250)].seconds == pytest.approx(3 * 0.040)  # nor the 16-ms one
    assert timer.counter.switch_steps == 2
    assert timer.counter.switch_seconds == pytest.approx(0.040 + 0.016)


def test_k_is_the_longest_scheduled_draft_list_not_the_lookup() -> None:
    step = decode(130, 2)
    step.spec["d0"] = [-1]  # truncated near max_model_len: still a k=2 step
    timer = run([(0.0, decode(130, 2)), (0.02, step)])
    ((key, totals),) = timer.counter.totals().items()
    assert key == (2, 129, 136) and totals.requests == 130 and totals.tokens == step.total


def test_a_decode_step_carrying_prefill_counts_in_its_cell_with_all_its_tokens() -> None:
    timer = run([(0.0, decode(8, 3)), (0.02, decode(8, 3, prefill=500))])
    totals = timer.counter.totals()[cell_key(3, 9)]
    assert totals.steps == 1 and totals.tokens == 8 * 4 + 500 and totals.requests == 9


@pytest.mark.parametrize(
    ("step", "decodes"),
    [
        (Step({"a": 1, "b": 1}), True),  # k=0 decode
        (Step({"a": 1, "b": 57}), True),  # k=0 decode next to a prefill chunk
        (Step({"a": 57, "b": 9}), False),  # only prefill
        (Step({"a": 4, "b": 57}, {"a": [-1, -1, -1]}), True),  # drafts verified
    ],
)
def test_steps_without_any_decode_are_counted_apart(step: Step, decodes: bool) -> None:
    timer = run([(0.0, decode(2, 0)), (0.01, step)])
    assert timer.counter.steps_without_decode == (0 if decodes else 1)
    assert sum(t.steps for t in timer.counter.totals().values()) == (1 if decodes else 0)


def test_first_call_empty_steps_and_the_step_after_the_engine_emptied_only_start_the_clock() -> (
    None
):
    last = decode(2, 1)
    last.idle_after = True  # the scheduler had no request left: the engine goes idle
    timer = run(
        [
            (0.0, decode(2, 1)),  # first call: no previous step
            (0.01, decode(2, 1)),  # counted: 10 ms
            (0.02, Step({})),  # nothing scheduled: not a step
            (0.03, decode(2, 1)),  # after an empty step: the gap may be waiting
            (0.04, last),  # counted: 10 ms, then idle
            (9.00, decode(2, 1)),  # after idle: not 8.96 s
            (9.01, decode(2, 1)),  # counted
        ]
    )
    assert timer.counter.totals()[cell_key(1, 2)].steps == 3
    assert timer.counter.totals()[cell_key(1, 2)].seconds == pytest.approx(0.03)


def test_switched_off_nothing_counts_and_back_on_the_gap_is_not_a_step() -> None:
    timer = run([(0.0, decode(2, 1)), (0.01, decode(2, 1))])
    timer.set_enabled(False)
    assert not timer.enabled
    timer.set_enabled(True)
    run([(5.0, decode(2, 1)), (5.01, decode(2, 1))], timer)
    assert timer.counter.totals()[cell_key(1, 2)].steps == 2
    timer.set_enabled(True)  # already on: the clock keeps running
    run([(5.02, decode(2, 1))], timer)
    assert timer.counter.totals()[cell_key(1, 2)].steps == 3


def test_wire_form_carries_the_start_time_and_the_cells() -> None:
    timer = run([(0.0, decode(2, 1)), (0.5, decode(2, 1))])
    wire = timer.to_wire()
    assert wire["started_at"] == 1000.0 and wire["steps_without_decode"] == 0
    assert wire["cells"] == [[1, 2, 2, 1.0, 0.5, 0.25, 4.0, 2.0]]


# Any sequence of steps: the counts equal a plain per-request reading of the same steps.

steps_strategy = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=0.5),  # time since the previous call
        st.lists(st.integers(min_value=1, max_value=40), max_size=20),  # tokens per request
        st.lists(st.integers(min_value=0, max_value=4), max_size=20),  # drafts per request
        st.booleans(),  # idle after
        st.one_of(st.none(), st.integers(min_value=0, max_value=4)),  # drafts made (None: k)
    ),
    max_size=40,
)


@given(steps_strategy)
def test_counts_match_a_plain_reading_of_every_step(raw: list[tuple]) -> None:
    timer = StepTimer(started_at=0.0)
    expected: dict[tuple[int, int, int], list[float]] = {}
    expected_without = expected_switches = 0
    now, last = 0.0, None
    for gap, tokens, drafts, idle_after, made in raw:
        now += gap
        scheduled = {f"r{i}": n for i, n in enumerate(tokens)}
        spec = {f"r{i}": [0] * d for i, d in enumerate(drafts[: len(tokens)]) if d}
        k = max((len(v) for v in spec.values()), default=0)
        drafts_next = k if made is None else made
        timer.on_step(
            now, scheduled, sum(tokens), spec, idle_after=idle_after, drafts_next=drafts_next
        )
        if last is not None and tokens:
            if not (k > 0 or any(n == 1 for n in tokens)):
                expected_without += 1
            elif drafts_next != k:
                expected_switches += 1  # it drafted another k than it verified: apart
            else:
                sums = expected.setdefault(cell_key(k, len(tokens)), [0, 0, 0, 0])
                sums[0] += 1
                sums[1] += now - last
                sums[2] += sum(tokens)
                sums[3] += len(tokens)
        last = None if (not tokens or idle_after) else now
    got = timer.counter.totals()
    assert set(got) == set(expected)
    for key, (steps, seconds, tokens_sum, requests) in expected.items():
        assert got[key].steps == steps and got[key].tokens == tokens_sum
        assert got[key].requests == requests
        assert got[key].seconds == pytest.approx(seconds)
    assert timer.counter.steps_without_decode == expected_without
    assert timer.counter.switch_steps == expected_switches


@given(steps_strategy)
def test_the_steps_it_hands_back_are_exactly_those_in_the_cells(raw: list[tuple]) -> None:
    timer = StepTimer(started_at=0.0)
    handed: dict[tuple[int, int, int], list[float]] = {}
    now = 0.0
    for gap, tokens, drafts, idle_after, made in raw:
        now += gap
        scheduled = {f"r{i}": n for i, n in enumerate(tokens)}
        spec = {f"r{i}": [0] * d for i, d in enumerate(drafts[: len(tokens)]) if d}
        k = max((len(v) for v in spec.values()), default=0)
        timed = timer.on_step(
            now, scheduled, sum(tokens), spec,
            idle_after=idle_after, drafts_next=k if made is None else made,
        )  # fmt: skip
        if timed is not None:
            assert timed.batch_size == len(tokens)
            assert timed.k == max((len(v) for v in spec.values()), default=0)
            sums = handed.setdefault(cell_key(timed.k, timed.batch_size), [0, 0.0])
            sums[0] += 1
            sums[1] += timed.seconds
    got = timer.counter.totals()
    assert set(got) == set(handed)
    for key, (steps, seconds) in handed.items():
        assert got[key].steps == steps and got[key].seconds == pytest.approx(seconds)
