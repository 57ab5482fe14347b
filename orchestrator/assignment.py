"""How several orchestrators share the topics they read: partition k of every topic goes to one instance.

A saga's StartSaga, its control messages and its participants' replies all carry the saga id as key, and
every topic of a deployment has SAGA_TOPIC_PARTITIONS partitions, so they all land on the same partition
number. Giving one instance partition k of every topic (as Kafka Streams does for co-partitioned topics)
keeps each saga on one instance: its state stays in that instance's cache, and two instances never race to
append the same saga's next event. aiokafka's default (round robin) deals the partitions of each topic out
separately, which would split a saga's topics over instances.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

log = logging.getLogger("saga.orchestrator.assignment")


def copartitioned(subscriptions: Mapping[str, Iterable[str]], partitions_of: Mapping[str, Iterable[int]]
                  ) -> dict[str, dict[str, list[int]]]:
    """``{member: {topic: [partition, ...]}}``: the partition numbers in use, in order, split into contiguous
    runs over the members in name order (the first ones get one more when it does not divide), each member
    given its numbers in every topic it subscribes to. A partition whose owner does not subscribe to its topic
    (members of two versions during a rolling deploy) goes to one that does, by partition number."""
    ordered = sorted(subscriptions)
    wanted = {member: set(topics) for member, topics in subscriptions.items()}
    numbers = sorted({number for partitions in partitions_of.values() for number in partitions})
    assignment: dict[str, dict[str, list[int]]] = {member: {} for member in ordered}
    if not ordered:
        return assignment
    share, extra = divmod(len(numbers), len(ordered))
    owner: dict[int, str] = {}
    start = 0
    for index, member in enumerate(ordered):
        length = share + (1 if index < extra else 0)
        for number in numbers[start:start + length]:
            owner[number] = member
        start += length
    for topic, partitions in sorted(partitions_of.items()):
        readers = [member for member in ordered if topic in wanted[member]]
        if not readers:
            continue
        for number in sorted(partitions):
            member = owner[number] if topic in wanted[owner[number]] else readers[number % len(readers)]
            assignment[member].setdefault(topic, []).append(number)
    return assignment


class CoPartitionedAssignor(AbstractPartitionAssignor):  # type: ignore[misc]  # aiokafka's base is untyped
    """The group's assignor: ``copartitioned`` over the topics the members subscribe to."""

    name = "saga-copartitioned"
    version = 0

    @classmethod
    def assign(cls, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
               ) -> dict[str, ConsumerProtocolMemberAssignment]:
        topics = sorted({topic for metadata in members.values() for topic in metadata.subscription})
        partitions_of: dict[str, list[int]] = {}
        for topic in topics:
            partitions = cluster.partitions_for_topic(topic)
            if partitions is None:
                log.warning("no partition metadata for topic", extra={"topic": topic})
                continue
            partitions_of[topic] = sorted(partitions)
        counts = {len(partitions) for partitions in partitions_of.values()}
        if len(counts) > 1:
            log.warning("the topics have different partition counts: a saga's messages can reach two instances",
                        extra={"partitions": {topic: len(p) for topic, p in partitions_of.items()}})
        split = copartitioned({member: metadata.subscription for member, metadata in members.items()}, partitions_of)
        return {member: ConsumerProtocolMemberAssignment(cls.version, sorted(split[member].items()), b"")
                for member in members}

    @classmethod
    def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(cls.version, list(topics), b"")

    @classmethod
    def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
        pass
