"""The daemon's log stream: one JSON object per line, whoever logs. The cycle's thread logs
through structlog while APScheduler's thread logs through the standard library; the soak found
a "cycle done" record and a scheduler warning on one line (the two wrote through different
locks, and structlog's print wrote the record and its newline separately)."""

from __future__ import annotations

import json
import logging
import threading
import time

import structlog

from tabletune.daemon import logs


class SlowStream:
    """A text stream that yields the GIL inside every write, so threads interleave."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        time.sleep(0)
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        time.sleep(0)


def test_every_write_is_one_whole_record() -> None:
    stream = SlowStream()
    logs.configure(level="info", fmt="json", stream=stream)
    structlog.get_logger("tabletune.test").info("cycle done", seconds=1.0)
    logging.getLogger("apscheduler.test").warning("job skipped")
    assert [json.loads(w)["event"] for w in stream.writes] == ["cycle done", "job skipped"]
    assert all(w.endswith("\n") and w.count("\n") == 1 for w in stream.writes)


def test_threads_logging_both_ways_never_share_a_line() -> None:
    stream = SlowStream()
    logs.configure(level="info", fmt="json", stream=stream)

    def ours() -> None:
        for i in range(300):
            structlog.get_logger("tabletune.test").info("cycle done", i=i)

    def library() -> None:
        for i in range(300):
            logging.getLogger("apscheduler.test").warning("job skipped %d", i)

    threads = [threading.Thread(target=f) for f in (ours, library, ours, library)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = "".join(stream.writes).splitlines()
    assert len(lines) == 1200
    assert {json.loads(line)["event"].split()[0] for line in lines} == {"cycle", "job"}
