"""structlog set-up: one JSON object per line on stderr (journald and k8s keep it), tracebacks
as structured fields; ``console`` for people at a terminal. Libraries that log through the
standard library (APScheduler: missed runs, a job's exception) come out in the same format on
the same stream, one whole record per write under one lock (the soak found a record of each
kind on one line when the two paths wrote separately)."""

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


class _LibraryHandler(logging.Handler):
    """The root logger's handler installed by ``configure`` (replaced when it runs again).
    It writes through structlog's writer for the same stream, so both share its lock."""

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self._out = structlog.WriteLogger(stream)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._out.msg(self.format(record))
        except Exception:  # a log record must never raise, as in StreamHandler.emit
            self.handleError(record)


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
        # One write of record + newline per record (print would write the newline apart).
        logger_factory=structlog.WriteLoggerFactory(file=stream),
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
