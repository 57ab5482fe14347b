"""Partition k of every topic the orchestrator reads goes to one instance."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from saga_orchestrator.orchestrator.assignment import CoPartitionedAssignor, copartitioned

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
    def __init__(self, topics: tuple[str, ...]) -> None:
        self.subscription = list(topics)


def test_the_assignor_speaks_aiokafka() -> None:
    members: Any = {"m-2": _Metadata(TOPICS), "m-1": _Metadata(TOPICS)}
    assignment = CoPartitionedAssignor.assign(_Cluster(), members)
    first = dict(assignment["m-1"].assignment)
    assert first == {topic: [0, 1, 2] for topic in TOPICS}
    assert dict(assignment["m-2"].assignment) == {topic: [3, 4, 5] for topic in TOPICS}
    assert CoPartitionedAssignor.metadata(TOPICS).subscription == list(TOPICS)
