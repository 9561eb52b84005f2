"""structlog set-up: one JSON object per line on stderr (journald and k8s keep it), tracebacks
as structured fields; ``console`` for people at a terminal. Libraries that log through the
standard library (APScheduler: missed runs, a job's exception) come out in the same format on
the same stream."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class _LibraryHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The root logger's handler installed by ``configure`` (replaced when it runs again)."""


def configure(*, level: str = "info", fmt: str = "json", stream: Any = None) -> None:
    stream = stream or sys.stderr
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    stamp: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    tracebacks: list[Any] = [structlog.processors.dict_tracebacks] if fmt == "json" else []
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *stamp, *tracebacks, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    handler = _LibraryHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                *tracebacks,
                renderer,
            ],
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *stamp],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _LibraryHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    # Libraries' INFO is per-request chatter (httpx logs every scrape): warnings and up only.
    root.setLevel(max(LEVELS[level], logging.WARNING))
