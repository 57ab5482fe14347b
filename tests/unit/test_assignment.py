"""Partition k of every topic the orchestrator reads goes to one instance."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.trip_changes import FRAUD_CHECKED
from saga_orchestrator.orchestrator.assignment import (
    CoPartitionedAssignor,
    GroupView,
    Served,
    copartitioned,
    decode_served,
    encode_served,
    shapes_of,
)
from saga_orchestrator.participants.trip import TRIP

TOPICS = ("saga.start", "saga.control", "flight.results", "hotel.results")


@given(members=st.sets(st.text("abcdef", min_size=1, max_size=4), min_size=1, max_size=6),
       partitions=st.integers(1, 24))
def test_each_partition_number_has_one_owner_across_topics(members: set[str], partitions: int) -> None:
    split = copartitioned({member: TOPICS for member in members}, {topic: range(partitions) for topic in TOPICS})
    owners: dict[int, set[str]] = {}
    for member, topics in split.items():
        assert set(topics) <= set(TOPICS)
        numbers = {tuple(numbers) for numbers in topics.values()}
        assert len(numbers) <= 1, (member, topics)  # the same numbers in every topic
        for taken in topics.values():
            for number in taken:
                owners.setdefault(number, set()).add(member)
    assert owners == {number: owners[number] for number in range(partitions)}  # every number is taken
    assert all(len(who) == 1 for who in owners.values())
    loads = sorted(len(next(iter(topics.values()), [])) for topics in split.values())
    assert loads[-1] - loads[0] <= 1  # balanced


def test_two_instances_of_eight_partitions() -> None:
    split = copartitioned({"b": TOPICS, "a": TOPICS}, {topic: range(8) for topic in TOPICS})
    assert split["a"] == {topic: [0, 1, 2, 3] for topic in TOPICS}
    assert split["b"] == {topic: [4, 5, 6, 7] for topic in TOPICS}


def test_a_topic_only_some_members_read_goes_to_them() -> None:
    partitions = {topic: range(4) for topic in (*TOPICS, "car.results")}
    split = copartitioned({"a": TOPICS, "b": (*TOPICS, "car.results")}, partitions)
    assert split["b"]["car.results"] == [0, 1, 2, 3]
    assert "car.results" not in split["a"]
    assert split["a"]["saga.start"] == [0, 1]


class _Cluster:
    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(6)) if topic in TOPICS else None


class _Metadata:
    def __init__(self, topics: tuple[str, ...], user_data: bytes = b"") -> None:
        self.subscription = list(topics)
        self.user_data = user_data


def test_the_assignor_speaks_aiokafka() -> None:
    members: Any = {"m-2": _Metadata(TOPICS), "m-1": _Metadata(TOPICS)}
    assignment = CoPartitionedAssignor().assign(_Cluster(), members)
    first = dict(assignment["m-1"].assignment)
    assert first == {topic: [0, 1, 2] for topic in TOPICS}
    assert dict(assignment["m-2"].assignment) == {topic: [3, 4, 5] for topic in TOPICS}
    assert CoPartitionedAssignor().metadata(TOPICS).subscription == list(TOPICS)


V1: Served = frozenset({("trip", 1, "f1")})
V12: Served = frozenset({("trip", 1, "f1"), ("trip", 2, "f2")})


def test_only_the_members_serving_every_version_get_partitions() -> None:
    partitions = {topic: range(6) for topic in TOPICS}
    split = copartitioned({"a": TOPICS, "b": TOPICS, "c": TOPICS}, partitions, {"a": V1, "b": V12, "c": V12})
    assert split["a"] == {}
    assert split["b"] == {topic: [0, 1, 2] for topic in TOPICS}
    assert split["c"] == {topic: [3, 4, 5] for topic in TOPICS}
    # the member serving more alone takes everything; once it left, the rest does
    assert copartitioned({"a": TOPICS, "b": TOPICS}, partitions, {"a": V1, "b": V12})["b"] == partitions_lists(6)
    assert copartitioned({"a": TOPICS}, partitions, {"a": V1})["a"] == partitions_lists(6)


def partitions_lists(count: int) -> dict[str, list[int]]:
    return {topic: list(range(count)) for topic in TOPICS}


def test_equal_sets_split_as_before_and_no_cover_falls_back_to_everyone() -> None:
    partitions = {topic: range(8) for topic in TOPICS}
    same = copartitioned({"a": TOPICS, "b": TOPICS}, partitions, {"a": V12, "b": V12})
    assert same == copartitioned({"a": TOPICS, "b": TOPICS}, partitions)
    car: Served = frozenset({("trip", 1, "f1"), ("car", 1, "c1")})
    split = copartitioned({"a": TOPICS, "b": TOPICS}, partitions, {"a": V12, "b": car})
    assert split == same  # neither serves car v1 and trip v2 both: today's split
    assert copartitioned({"a": TOPICS, "b": TOPICS}, partitions, {"b": V1})["a"] == {}  # a advertises nothing


_SHAPES = st.tuples(st.sampled_from(["trip", "car"]), st.integers(1, 3), st.sampled_from(["f1", "f2"]))


@given(served=st.dictionaries(st.sampled_from("abcde"), st.frozensets(_SHAPES, max_size=4), min_size=1),
       partitions=st.integers(1, 12))
def test_every_partition_goes_to_a_member_serving_the_most(served: dict[str, Served], partitions: int) -> None:
    union = frozenset().union(*served.values())
    full = {member for member, shapes in served.items() if shapes >= union} or set(served)
    split = copartitioned({member: TOPICS for member in served}, {topic: range(partitions) for topic in TOPICS},
                          served)
    owners = {number: member for member, topics in split.items() for numbers in topics.values() for number in numbers}
    assert set(owners) == set(range(partitions))
    assert set(owners.values()) <= full


def test_members_advertise_what_they_serve_and_learn_what_the_group_serves() -> None:
    assert decode_served(encode_served(V12)) == V12
    assert encode_served(V12) == b'[["trip",1,"f1"],["trip",2,"f2"]]'
    assert decode_served(b"") == frozenset() and decode_served(b"{nonsense") == frozenset()
    old, new = CoPartitionedAssignor(V1), CoPartitionedAssignor(V12)
    members: Any = {"old": old.metadata(TOPICS), "new": new.metadata(TOPICS)}
    assignment = new.assign(_Cluster(), members)
    assert assignment["old"].assignment == [] and len(dict(assignment["new"].assignment)["saga.start"]) == 6
    clock = [0.0]
    view = GroupView(grace_s=10, clock=lambda: clock[0])
    CoPartitionedAssignor(V1, view).on_assignment(assignment["old"])
    assert view.serves("trip", 2) and not view.serves("trip", 3)
    assert view.serves("trip", 2, "f2") and not view.serves("trip", 2, "f1")  # that shape of it, or any (None)
    view.assigned(V1)  # the member serving trip v2 left (restarting)
    clock[0] = 9.0
    assert view.serves("trip", 2) and view.serves("trip", 2, "f2")  # within the grace
    clock[0] = 10.5
    assert not view.serves("trip", 2) and not view.serves("trip", 2, "f2") and view.serves("trip", 1, "f1")


def test_the_member_with_a_patch_marker_takes_every_partition_of_the_same_version() -> None:
    without, patched = CoPartitionedAssignor(shapes_of([TRIP])), CoPartitionedAssignor(shapes_of([FRAUD_CHECKED]))
    assert patched.served > without.served  # the patched version keeps the shape it had
    members: Any = {"a": without.metadata(TOPICS), "b": patched.metadata(TOPICS)}
    assignment = without.assign(_Cluster(), members)
    assert assignment["a"].assignment == [] and dict(assignment["b"].assignment) == {t: list(range(6)) for t in TOPICS}
    view = GroupView()
    without.view = view
    without.on_assignment(assignment["a"])
    assert view.serves("trip", 1, FRAUD_CHECKED.fingerprint) and not view.serves("trip", 1, "f0")


@pytest.mark.parametrize("user_data", [b"[[1]]", b'"x"', b'[["trip",1]]'])
def test_odd_user_data_serves_nothing(user_data: bytes) -> None:
    assert decode_served(user_data) == frozenset()
