"""The one place the daemon retries: temporary errors only, on a schedule that is a setting,
logging ``attempt i/N``. Everything else (PermanentError, bugs) goes straight up.

A retry is only started when the caller says there is time for it (``may_wait``: the process
is not stopping, and a try that starts after the wait can still end by the replica's deadline),
and the wait between two tries may end early (``sleep`` returns when the daemon stops): asked
again after it, ``may_wait`` ends the retries with the last error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import structlog
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    wait_chain,
    wait_fixed,
)

from tabletune.errors import TemporaryError

T = TypeVar("T")
log = structlog.get_logger("tabletune.daemon.retry")


def always(wait_s: float) -> bool:
    return True


def with_retries(
    action: Callable[[], T],
    *,
    what: str,
    backoffs_s: Sequence[float],
    sleep: Callable[[float], None] = time.sleep,
    may_wait: Callable[[float], bool] = always,
) -> T:
    """Run ``action``; on TemporaryError wait ``backoffs_s[i]`` and try again (len+1 tries),
    while ``may_wait(wait_s)`` allows a try that starts ``wait_s`` from now.

    The first try runs bare (the common case costs nothing); tenacity takes over on failure.
    """
    attempts = len(backoffs_s) + 1
    try:
        return action()
    except TemporaryError as error:
        if attempts == 1 or not may_wait(backoffs_s[0]):
            raise
        _log_retry(what, 1, attempts, error, backoffs_s[0])
        last = error
    sleep(backoffs_s[0])
    later = backoffs_s[1:]

    def out_of_tries(state: RetryCallState) -> bool:
        number = state.attempt_number  # tenacity's count; the bare first try came before
        return number > len(later) or not may_wait(later[number - 1])

    def before_sleep(state: RetryCallState) -> None:
        nonlocal last
        error = state.outcome.exception() if state.outcome else None
        if isinstance(error, TemporaryError):
            last = error
        number = state.attempt_number + 1
        _log_retry(what, number, attempts, error, backoffs_s[number - 1])

    def again() -> T:
        if not may_wait(0.0):  # the wait ended early: the daemon is stopping
            raise last
        return action()

    retrying = Retrying(
        retry=retry_if_exception_type(TemporaryError),
        wait=wait_chain(*[wait_fixed(s) for s in later]) if later else wait_fixed(0),
        stop=out_of_tries,
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    return retrying(again)


def _log_retry(
    what: str, number: int, attempts: int, error: BaseException | None, wait_s: float
) -> None:
    log.warning(
        "temporary failure, retrying",
        what=what,
        attempt=f"{number}/{attempts}",
        error=str(error),
        wait_s=wait_s,
    )
