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
    """Run ``action``; on TemporaryError wait ``backoffs_s[i]`` and try again (len+1 tries)."""
    attempts = len(backoffs_s) + 1

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        log.warning(
            "temporary failure, retrying",
            what=what,
            attempt=f"{state.attempt_number}/{attempts}",
            error=str(error),
            wait_s=backoffs_s[state.attempt_number - 1],
        )

    retrying = Retrying(
        retry=retry_if_exception_type(TemporaryError),
        wait=wait_chain(*[wait_fixed(s) for s in backoffs_s]) if backoffs_s else wait_fixed(0),
        stop=stop_after_attempt(attempts),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    return retrying(action)
