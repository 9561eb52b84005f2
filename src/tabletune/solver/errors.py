"""The solver's one error type (the solver imports nothing else of TableTune)."""


class SolverError(ValueError):
    """Inputs the solver cannot work with, or a result that failed its self-check."""
