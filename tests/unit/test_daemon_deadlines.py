"""Deadline budgeting, pure: a cycle's budget, scrape deadlines, and retries that never start a
try the deadline cannot hold or that a stopping daemon would wait for."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.daemon.deadlines import CycleBudget, try_fits
from tabletune.daemon.retry import with_retries
from tabletune.errors import TemporaryError

seconds = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


def test_the_budget_is_a_share_of_the_interval() -> None:
    budget = CycleBudget.of(100.0, interval_s=15.0, share=0.8)
    assert budget.deadline == pytest.approx(112.0)
    assert budget.scrape_deadline() == pytest.approx(106.0)  # half: admin calls need time


@given(start=seconds, interval=st.floats(0.1, 600), share=st.floats(0.01, 1.0))
def test_a_cycle_always_ends_before_the_next_is_due(
    start: float, interval: float, share: float
) -> None:
    budget = CycleBudget.of(start, interval_s=interval, share=share)
    scrapes_end = budget.scrape_deadline()
    assert start <= scrapes_end <= budget.deadline <= start + interval + 1e-9
    assert budget.deadline - scrapes_end >= (budget.deadline - start) / 2 - 1e-9


class Hung:
    """An admin call that fails after taking ``attempt_s`` of a fake clock."""

    def __init__(self, attempt_s: float) -> None:
        self.now = 0.0
        self.attempt_s = attempt_s
        self.tries: list[float] = []

    def __call__(self) -> None:
        self.tries.append(self.now)
        self.now += self.attempt_s
        raise TemporaryError("ReadTimeout")

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@given(
    backoffs=st.lists(st.floats(0.0, 10.0), max_size=6),
    attempt_s=st.floats(0.0, 10.0),
    deadline=st.floats(0.0, 60.0),
)
def test_retries_never_start_a_try_that_ends_past_the_deadline(
    backoffs: list[float], attempt_s: float, deadline: float
) -> None:
    call = Hung(attempt_s)
    with pytest.raises(TemporaryError):
        with_retries(
            call,
            what="GET table",
            backoffs_s=backoffs,
            sleep=call.sleep,
            may_wait=lambda wait_s: try_fits(
                call.now, wait_s=wait_s, attempt_s=attempt_s, deadline=deadline
            ),
        )
    # The first try always runs; every later one started where it could end in time.
    assert call.tries[0] == 0.0
    assert all(start + attempt_s <= deadline + 1e-9 for start in call.tries[1:])
    assert len(call.tries) <= len(backoffs) + 1
    if len(call.tries) <= len(backoffs):  # stopped early: the next try would not have fit
        wait = backoffs[len(call.tries) - 1]
        assert call.now + wait + attempt_s > deadline


def test_a_hung_replica_is_tried_while_a_try_fits() -> None:
    # 5 s per try (the timeout), 12 s of budget: tries at 0 and 6; one at 12 would end at 17.
    call = Hung(5.0)
    with pytest.raises(TemporaryError, match="ReadTimeout"):
        with_retries(
            call,
            what="GET table",
            backoffs_s=(1, 1, 2, 3, 5),
            sleep=call.sleep,
            may_wait=lambda w: try_fits(call.now, wait_s=w, attempt_s=5.0, deadline=12.0),
        )
    assert call.tries == [0.0, 6.0]


def test_a_stop_during_a_retry_wait_ends_the_retries() -> None:
    stopping = False
    tries = 0

    def busy() -> None:
        nonlocal tries
        tries += 1
        raise TemporaryError("HTTP 503")

    def interrupted(seconds: float) -> None:  # SIGTERM arrives during the second wait
        nonlocal stopping
        stopping = tries >= 2

    with pytest.raises(TemporaryError, match="503"):
        with_retries(
            busy,
            what="PUT table",
            backoffs_s=(1, 1, 2, 3, 5),
            sleep=interrupted,
            may_wait=lambda _: not stopping,
        )
    assert tries == 2  # no try after the wait the stop interrupted
