"""The one place the daemon retries: temporary errors only, on a schedule that is a setting,
logging ``attempt i/N``. Everything else (PermanentError, bugs) goes straight up."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import structlog
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_chain,
    wait_fixed,
)

from tabletune.errors import TemporaryError

T = TypeVar("T")
log = structlog.get_logger("tabletune.daemon.retry")


def with_retries(
    action: Callable[[], T],
    *,
    what: str,
    backoffs_s: Sequence[float],
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``action``; on TemporaryError wait ``backoffs_s[i]`` and try again (len+1 tries).

    The first try runs bare (the common case costs nothing); tenacity takes over on failure.
    """
    attempts = len(backoffs_s) + 1
    try:
        return action()
    except TemporaryError as error:
        if attempts == 1:
            raise
        _log_retry(what, 1, attempts, error, backoffs_s[0])
    sleep(backoffs_s[0])

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        number = state.attempt_number + 1  # the bare first try came before
        _log_retry(what, number, attempts, error, backoffs_s[number - 1])

    later = backoffs_s[1:]
    retrying = Retrying(
        retry=retry_if_exception_type(TemporaryError),
        wait=wait_chain(*[wait_fixed(s) for s in later]) if later else wait_fixed(0),
        stop=stop_after_attempt(attempts - 1),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    return retrying(action)


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
