"""Forgetting replicas, pure: exactly those without data for the TTL, once; a forgotten replica
still named stays forgotten until data comes; memory bounded by the replicas named."""

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


# Each step: (time step, replicas with data, replicas named without data).
names = st.sampled_from(["a", "b", "c", "d"])
steps = st.lists(
    st.tuples(st.floats(1.0, 400.0), st.frozensets(names), st.frozensets(names)), max_size=40
)


@given(steps=steps)
def test_forgotten_exactly_when_the_ttl_passed_without_data(
    steps: list[tuple[float, frozenset[str], frozenset[str]]],
) -> None:
    presence = Presence(forget_after_s=TTL)
    now = 0.0
    last_data: dict[str, float] = {}  # the model: when each was last heard of
    for step, with_data, without in steps:
        now += step
        for replica in with_data:
            presence.data(replica, now)
            last_data[replica] = now
        for replica in without - with_data:
            if not presence.forgotten(replica):
                presence.seen(replica, now)
                last_data.setdefault(replica, now)
        due = presence.due(now, named=with_data | without)
        expected = sorted(r for r, t in last_data.items() if now - t >= TTL)
        assert due == expected
        for replica in due:
            del last_data[replica]
        assert len(presence) == len(last_data) <= 4
