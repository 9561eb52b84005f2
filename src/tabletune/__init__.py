"""TableTune: measure, compute and keep right vLLM's batch-size -> draft-length table."""

__version__ = "0.1.0"
