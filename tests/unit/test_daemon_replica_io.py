"""Replicas' I/O side by side: answers handled on the waiting thread, a hung replica late and
never piled up, stop ends the wait, bugs surface, workers bounded and ending when idle."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tabletune.daemon.replica_io import ReplicaIo, Unanswered
from tabletune.errors import InputError, TemporaryError
from tests.support.servers import poll_until


class Ticks:
    """A monotonic clock that moves one second each time it is read: deadlines pass after a
    known number of looks, whatever the machine's speed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def hung() -> Iterator[threading.Event]:
    release = threading.Event()
    yield release
    release.set()  # let the worker go whatever the test did


def test_answers_are_handled_on_the_waiting_thread() -> None:
    io = ReplicaIo(workers=4)
    answers = io.round("admin", deadline=float("inf"))
    seen: list[tuple[str, object, int]] = []
    for name in ("a", "b", "c"):
        answers.submit(
            name,
            lambda name=name: name.upper(),  # type: ignore[misc]
            done=lambda value, name=name: seen.append((name, value, threading.get_ident())),  # type: ignore[misc]
            failed=lambda error: None,
        )
    assert not answers.wait()
    assert sorted(seen) == [(n, n.upper(), threading.get_ident()) for n in ("a", "b", "c")]


def test_errors_go_to_failed_and_bugs_fail_the_wait() -> None:
    io = ReplicaIo(workers=2)
    errors: list[str] = []

    def refused() -> None:
        raise InputError("garbled /metrics")

    answers = io.round("scrape", deadline=float("inf"))
    answers.submit("a", refused, done=lambda _: None, failed=lambda e: errors.append(str(e)))
    assert not answers.wait() and errors == ["garbled /metrics"]

    def bug() -> None:
        raise ZeroDivisionError("a bug")

    answers = io.round("scrape", deadline=float("inf"))
    answers.submit("a", bug, done=lambda _: None, failed=lambda e: errors.append(str(e)))
    with pytest.raises(ZeroDivisionError):
        answers.wait()


def test_a_hung_replica_is_late_and_never_piled_up(hung: threading.Event) -> None:
    ticks = Ticks()
    io = ReplicaIo(workers=4, monotonic=ticks)
    done: list[str] = []
    answers = io.round("admin", deadline=ticks.now + 20)
    answers.submit("hung", hung.wait, done=lambda _: done.append("hung"), failed=print)
    answers.submit("ok", lambda: "view", done=lambda _: done.append("ok"), failed=print)
    assert answers.wait() == Unanswered(late=["hung"], unjudged=[])
    assert done == ["ok"]
    # Its request still runs: nothing more goes to it until it ends; the others go on.
    again = io.round("admin", deadline=ticks.now + 20)
    assert not again.submit("hung", lambda: "x", done=print, failed=print)
    assert io.busy("admin", "hung") and not io.busy("scrape", "hung")  # per kind
    assert again.submit("ok", lambda: "view", done=lambda _: done.append("ok"), failed=print)
    assert not again.wait()
    hung.set()
    poll_until(lambda: not io.busy("admin", "hung"), timeout_s=10, what="the request ended")
    # The late answer is dropped (its round is over); the replica can be asked again.
    assert done == ["ok", "ok"]
    last = io.round("admin", deadline=ticks.now + 20)
    assert last.submit("hung", lambda: "view", done=lambda _: done.append("hung"), failed=print)
    assert not last.wait() and done[-1] == "hung"


def test_stop_ends_the_wait_with_the_unanswered(hung: threading.Event) -> None:
    io = ReplicaIo(workers=2)
    stop = threading.Event()
    answers = io.round("admin", deadline=float("inf"), stopped=stop.is_set)
    answers.submit("hung", hung.wait, done=print, failed=print)
    threading.Timer(0.2, stop.set).start()
    assert answers.wait().late == ["hung"]


def test_answers_that_came_are_handled_after_the_deadline() -> None:
    ticks = Ticks()
    io = ReplicaIo(workers=2, monotonic=ticks)
    got: list[str] = []
    answers = io.round("admin", deadline=0.0)  # already past
    answers.submit("a", lambda: "view", done=got.append, failed=print)
    poll_until(lambda: not io.busy("admin", "a"), timeout_s=10, what="the answer")
    assert not answers.wait() and got == ["view"]


def test_workers_are_bounded_and_end_when_idle(hung: threading.Event) -> None:
    io = ReplicaIo(workers=2, idle_s=0.05)
    answers = io.round("admin", deadline=float("inf"))
    for name in "abcde":
        answers.submit(name, hung.wait, done=print, failed=print)
    assert io.threads == 2  # the other three wait for a worker
    hung.set()
    assert not answers.wait()
    poll_until(lambda: io.threads == 0, timeout_s=10, what="idle workers to end")
    # and new work starts a worker again
    answers = io.round("admin", deadline=float("inf"))
    out: list[int] = []
    answers.submit("a", lambda: 1, done=out.append, failed=print)
    assert not answers.wait() and out == [1]


def test_temporary_errors_are_failures_of_that_replica_only() -> None:
    io = ReplicaIo(workers=4)
    failed: dict[str, str] = {}
    done: list[str] = []

    def down() -> str:
        raise TemporaryError("HTTP 503")

    answers = io.round("admin", deadline=float("inf"))
    answers.submit("down", down, done=done.append, failed=lambda e: failed.update(down=str(e)))
    answers.submit("up", lambda: "up", done=done.append, failed=print)
    assert not answers.wait()
    assert failed == {"down": "HTTP 503"} and done == ["up"]


def test_requests_never_sent_in_time_are_dropped_not_late(hung: threading.Event) -> None:
    # One worker, held by a hung replica: the others wait in line until the deadline. They
    # were never sent (the daemon was behind): not their fault, and never sent afterwards.
    ticks = Ticks()
    io = ReplicaIo(workers=1, monotonic=ticks)
    ran: list[str] = []
    answers = io.round("scrape", deadline=ticks.now + 10)
    answers.submit("hung", hung.wait, done=print, failed=print)
    for name in ("b", "c"):
        answers.submit(name, lambda name=name: ran.append(name), done=print, failed=print)  # type: ignore[misc]
    assert answers.wait() == Unanswered(late=["hung"], unjudged=["b", "c"])
    hung.set()
    poll_until(
        lambda: not any(io.busy("scrape", k) for k in ("hung", "b", "c")),
        timeout_s=10,
        what="the line drained",
    )
    assert ran == []


def test_a_request_sent_less_than_a_timeout_ago_gets_no_verdict(hung: threading.Event) -> None:
    # Sent shortly before time was up (the daemon was busy): slow or hung, nobody can tell yet.
    ticks = Ticks()
    io = ReplicaIo(workers=1, monotonic=ticks)
    answers = io.round("admin", deadline=ticks.now + 10, patience_s=1000)
    answers.submit("slow", hung.wait, done=print, failed=print)
    assert answers.wait() == Unanswered(late=[], unjudged=["slow"])


def test_an_answer_handled_after_the_deadline_may_get_no_verdict() -> None:
    # A table read answered in time but handled late would start planning and a push the cycle
    # has no time for: no verdict (decided next cycle). A push's outcome is still recorded.
    ticks = Ticks()
    io = ReplicaIo(workers=2, monotonic=ticks)
    got: list[str] = []
    answers = io.round("admin", deadline=0.0)
    answers.submit("read", lambda: "view", done=got.append, failed=print, after_deadline=False)
    answers.submit("push", lambda: "pushed", done=got.append, failed=print)
    poll_until(
        lambda: not io.busy("admin", "read") and not io.busy("admin", "push"),
        timeout_s=10,
        what="both answered",
    )
    assert answers.wait() == Unanswered(late=[], unjudged=["read"])
    assert got == ["pushed"]
