"""TableTune's own error hierarchy: library errors are wrapped, never leaked."""

from __future__ import annotations


class TableTuneError(Exception):
    """Base class of every error TableTune raises on purpose."""


class InputError(TableTuneError):
    """A file, argument or request body is malformed or incompatible; nothing was changed."""


class TemporaryError(TableTuneError):
    """An operation failed for a reason that may pass (network, 5xx); retrying may help."""

    def __init__(self, message: str, *, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(TableTuneError):
    """An operation failed for a reason retrying will not fix (4xx, incompatible engine)."""
