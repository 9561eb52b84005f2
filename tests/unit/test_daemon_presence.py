"""Forgetting replicas, pure: exactly those without data for the TTL, once; a forgotten replica
still named stays forgotten until data comes; memory bounded by the replicas named; time in
which the source brought no data from anyone (Prometheus down) does not count."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tabletune.daemon.presence import Presence

TTL = 600.0


def test_a_replica_without_data_is_forgotten_after_the_ttl() -> None:
    presence = Presence(forget_after_s=TTL)
    presence.data("a", 0.0)
    presence.data("b", 0.0)
    presence.data("a", 500.0)
    assert presence.due(599.0, named={"a", "b"}) == []
    assert presence.due(600.0, named={"a", "b"}) == ["b"]
    assert presence.due(1099.0, named={"a"}) == []  # a's clock restarted at 500
    assert presence.due(1100.0, named=set()) == ["a"]
    assert len(presence) == 0


def test_first_sight_without_data_starts_the_clock() -> None:
    presence = Presence(forget_after_s=TTL)
    presence.seen("never-answered", 100.0)
    presence.seen("never-answered", 400.0)  # does not restart it
    assert presence.due(700.0, named={"never-answered"}) == ["never-answered"]


def test_a_forgotten_replica_still_named_stays_forgotten_until_data() -> None:
    presence = Presence(forget_after_s=TTL)
    presence.seen("down", 0.0)
    assert presence.due(600.0, named={"down"}) == ["down"]
    presence.seen("down", 615.0)  # its source still reports it, without data
    assert presence.forgotten("down")
    assert presence.due(10_000.0, named={"down"}) == []  # not forgotten twice
    presence.data("down", 10_015.0)  # back: a new replica as far as we know
    assert not presence.forgotten("down")
    assert presence.due(10_015.0 + TTL, named={"down"}) == ["down"]


def test_a_forgotten_replica_no_longer_named_is_no_longer_remembered() -> None:
    presence = Presence(forget_after_s=TTL)
    presence.seen("gone", 0.0)
    presence.due(600.0, named={"gone"})
    presence.due(615.0, named=set())
    assert not presence.forgotten("gone")
    presence.seen("gone", 630.0)  # named again without data: a fresh clock
    assert presence.due(1229.0, named={"gone"}) == []
    assert presence.due(1230.0, named={"gone"}) == ["gone"]


def test_time_the_source_brought_no_data_at_all_does_not_count() -> None:
    # The soak: Prometheus down for 60 s with a 60 s TTL forgot all 200 running replicas.
    presence = Presence(forget_after_s=TTL)
    presence.cycle(0.0, source_saw_any=True)
    presence.data("a", 0.0)
    presence.data("b", 0.0)
    for now in (100.0, 300.0, 700.0):  # the source failed: nobody has data
        presence.cycle(now, source_saw_any=False)
        assert presence.due(now, named={"a", "b"}) == []
    presence.cycle(705.0, source_saw_any=True)  # back; "b" has data, "a" does not
    presence.data("b", 705.0)
    assert presence.due(705.0, named={"a", "b"}) == []  # 5 s of sighted time for "a"
    presence.cycle(1300.0, source_saw_any=True)
    presence.data("b", 1300.0)
    assert presence.due(1300.0, named={"a", "b"}) == ["a"]  # 5 + 595 s sighted


# Each step: (time step, replicas with data, replicas named without data).
names = st.sampled_from(["a", "b", "c", "d"])
steps = st.lists(
    # whole seconds: the model's sum and the clock's differences are then exact
    st.tuples(st.integers(1, 400).map(float), st.frozensets(names), st.frozensets(names)),
    max_size=40,
)


@given(steps=steps)
def test_forgotten_exactly_when_the_ttl_passed_without_data(
    steps: list[tuple[float, frozenset[str], frozenset[str]]],
) -> None:
    presence = Presence(forget_after_s=TTL)
    now = sighted = 0.0  # the model's clock counts only steps in which someone had data
    last_data: dict[str, float] = {}  # the model: when each was last heard of (sighted time)
    for step, with_data, without in steps:
        now += step
        sighted += step if with_data else 0.0
        presence.cycle(now, source_saw_any=bool(with_data))
        for replica in with_data:
            presence.data(replica, now)
            last_data[replica] = sighted
        for replica in without - with_data:
            if not presence.forgotten(replica):
                presence.seen(replica, now)
                last_data.setdefault(replica, sighted)
        due = presence.due(now, named=with_data | without)
        expected = sorted(r for r, t in last_data.items() if sighted - t >= TTL)
        assert due == expected
        for replica in due:
            del last_data[replica]
        assert len(presence) == len(last_data) <= 4
