"""The profiler's failures, in TableTune's hierarchy (the CLI prints them, exit code 2)."""

from __future__ import annotations

from tabletune.errors import PermanentError


class MeasurementError(PermanentError):
    """A measurement that cannot be a step time or an acceptance rate (what and why)."""


class EngineStartError(PermanentError):
    """vLLM did not come up; the message ends with the tail of its log."""


class NoPluginError(PermanentError):
    """The server has no TableTune plugin (no admin API), so k cannot be set at run time."""


class HookUnavailable(PermanentError):
    """The server cannot switch its rejection sampler at run time (no profiler hook)."""
