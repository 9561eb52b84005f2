"""Replicas' blocking I/O side by side: each request runs on a worker thread, its answer is
handled on the cycle's own thread as it comes, and a cycle waits for answers no longer than
its deadline (or until the daemon stops).

A replica that answers with an error, or not at all within its timeout (``patience_s``), is
that replica's problem this cycle. Its request may still be running (a hung engine holds it
until the HTTP timeout); no new request of the same kind goes to that replica until it ends, so
a hung replica never piles up threads or connections. A request sent less than a timeout
before the time was up, or still waiting for a worker (never sent then), gets no verdict: the
daemon ran out of time, which is no fault of the replica's (the caller tries again next cycle).

Only the requests run on the workers; everything they return is handled on the thread that
waits (``Round.wait``), so the daemon's state, metrics and alerts are never touched from two
threads. Workers are daemon threads (a hung request never holds the process at exit) and end
after a while without work.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tabletune.errors import TableTuneError

T = TypeVar("T")
POLL_S = 0.1  # how often a wait looks at the stop flag
IDLE_S = 30.0  # a worker without work this long ends


def never() -> bool:
    return False


@dataclass(frozen=True)
class Unanswered:
    """The requests of a round without an answer when its wait ended, each list sorted."""

    late: list[str]  # sent at least a timeout ago, no answer: the replica's problem
    unjudged: list[str]  # sent later, or never (it waited for a worker): the daemon's time ran out

    def __bool__(self) -> bool:
        return bool(self.late or self.unjudged)


@dataclass
class _Job(Generic[T]):
    busy_key: tuple[str, str]
    key: str
    action: Callable[[], T]
    done: Callable[[T], None]
    failed: Callable[[TableTuneError], None]
    round: Round
    after_deadline: bool  # its answer is still handled when it is handled late
    started: bool = False  # a worker took it (under the pool's lock)
    started_at: float = 0.0


@dataclass
class _Answer(Generic[T]):
    job: _Job[T]
    value: T | None = None
    error: BaseException | None = None

    def deliver(self) -> None:
        if isinstance(self.error, TableTuneError):
            self.job.failed(self.error)
        elif self.error is not None:
            raise self.error  # a bug: the cycle fails with its traceback, as without threads
        else:
            self.job.done(self.value)  # type: ignore[arg-type]


class ReplicaIo:
    """A small pool of worker threads shared by the cycle's rounds of replica I/O."""

    def __init__(
        self,
        *,
        workers: int,
        monotonic: Callable[[], float] = time.monotonic,
        idle_s: float = IDLE_S,
    ) -> None:
        self.workers = workers
        self.monotonic = monotonic
        self._idle_s = idle_s
        self._jobs: queue.SimpleQueue[_Job[Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # workers waiting for a job
        self._queued = 0  # jobs no worker has taken yet
        self._busy: set[tuple[str, str]] = set()

    def round(
        self,
        kind: str,
        *,
        deadline: float,
        patience_s: float = 0.0,
        stopped: Callable[[], bool] = never,
    ) -> Round:
        """Requests of one ``kind`` (scrape, admin) that must be answered by ``deadline``;
        one unanswered for ``patience_s`` after it was sent is late."""
        return Round(self, kind, deadline, patience_s, stopped)

    def busy(self, kind: str, key: str) -> bool:
        with self._lock:
            return (kind, key) in self._busy

    @property
    def threads(self) -> int:
        with self._lock:
            return self._threads

    def _submit(self, job: _Job[Any]) -> bool:
        with self._lock:
            if job.busy_key in self._busy:
                return False
            self._busy.add(job.busy_key)
            self._jobs.put(job)
            self._queued += 1
            if self._queued > self._idle and self._threads < self.workers:
                self._threads += 1
                threading.Thread(target=self._work, name="tabletune-io", daemon=True).start()
        return True

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    self._idle -= 1
                    if self._queued == 0:  # else a job came meanwhile: take it
                        self._threads -= 1
                        return
                continue
            with self._lock:
                self._idle -= 1
                self._queued -= 1
                job.started = not job.round.closed
                if not job.started:  # its round gave up on it: never sent
                    self._busy.discard(job.busy_key)
                    continue
                job.started_at = self.monotonic()
            answer: _Answer[Any] = _Answer(job)
            try:
                answer.value = job.action()
            except BaseException as error:  # handed to the waiting thread: bugs fail the cycle
                answer.error = error
            with self._lock:
                self._busy.discard(job.busy_key)
            job.round.answers.put(answer)

    def _close(self, round: Round) -> Unanswered:
        """No more answers for ``round``: its jobs not taken yet will never run."""
        now = self.monotonic()
        with self._lock:
            round.closed = True
            late = {
                job.key
                for job in round.pending.values()
                if job.started and now - job.started_at >= round.patience_s
            }
            return Unanswered(late=sorted(late), unjudged=sorted(set(round.pending) - late))


class Round:
    """One batch of requests and their deadline; ``wait`` handles the answers as they come."""

    def __init__(
        self,
        io: ReplicaIo,
        kind: str,
        deadline: float,
        patience_s: float,
        stopped: Callable[[], bool],
    ) -> None:
        self._io = io
        self._kind = kind
        self.deadline = deadline
        self.patience_s = patience_s
        self._stopped = stopped
        self.answers: queue.SimpleQueue[_Answer[Any]] = queue.SimpleQueue()
        self.pending: dict[str, _Job[Any]] = {}
        self.closed = False  # set under the pool's lock

    def submit(
        self,
        key: str,
        action: Callable[[], T],
        *,
        done: Callable[[T], None],
        failed: Callable[[TableTuneError], None],
        after_deadline: bool = True,
    ) -> bool:
        """Run ``action`` for replica ``key``; ``done(value)`` or ``failed(error)`` are called
        from ``wait``. False (nothing sent) while an earlier request of this kind to the same
        replica is still running. ``after_deadline`` False: an answer not handled by the
        deadline gets no verdict (its handling would start more work the cycle has no time
        for), like a request never sent."""
        job = _Job((self._kind, key), key, action, done, failed, self, after_deadline)
        if not self._io._submit(job):
            return False
        self.pending[key] = job
        return True

    def wait(self) -> Unanswered:
        """Handle answers until every request is answered, the deadline passes or the daemon
        stops; then the requests left without an answer (late, or without a verdict)."""
        dropped: list[str] = []
        while self.pending:
            remaining = self.deadline - self._io.monotonic()
            over = remaining <= 0 or self._stopped()
            try:  # answers that already came are handled even when time is up
                if over:
                    answer = self.answers.get_nowait()
                else:
                    answer = self.answers.get(timeout=min(remaining, POLL_S))
            except queue.Empty:
                if over:
                    break
                continue
            del self.pending[answer.job.key]
            if over and not answer.job.after_deadline:
                dropped.append(answer.job.key)
                continue
            answer.deliver()  # may submit more (a replica's next step)
        left = self._io._close(self)
        self.pending = {}
        if dropped:
            left = Unanswered(late=left.late, unjudged=sorted([*left.unjudged, *dropped]))
        return left
