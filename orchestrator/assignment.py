"""How several orchestrators share the topics they read: partition k of every topic goes to one instance.

A saga's StartSaga, its control messages and its participants' replies all carry the saga id as key, and
every topic of a deployment has SAGA_TOPIC_PARTITIONS partitions, so they all land on the same partition
number. Giving one instance partition k of every topic (as Kafka Streams does for co-partitioned topics)
keeps each saga on one instance: its state stays in that instance's cache, and two instances never race to
append the same saga's next event. aiokafka's default (round robin) deals the partitions of each topic out
separately, which would split a saga's topics over instances.

During a rolling deploy the instances serve different definition versions, and a saga is pinned to the version
it started on: an instance that lacks it would quarantine the saga. So each member advertises the (saga type,
version) pairs it serves in its member metadata, and the partitions go only to the members that serve every
version any member serves; the others wait, with none, until the new version is everywhere (or the members
that have it leave). Each member's assignment carries back what the whole group serves (``GroupView``), so an
instance that still meets a saga of a version it lacks knows whether another member serves it.
"""


from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

log = logging.getLogger("saga.orchestrator.assignment")

Served = frozenset[tuple[str, int]]
"""The (saga type, definition version) pairs a member can decide."""

SERVED_ELSEWHERE_GRACE_S = 60.0
"""How long a version the group served is still counted as served after the members serving it left: the time
an instance of the new version takes to restart during a rolling deploy. Its sagas' messages wait meanwhile
instead of being quarantined; after it, a version no member serves quarantines its sagas as before."""


def copartitioned(subscriptions: Mapping[str, Iterable[str]], partitions_of: Mapping[str, Iterable[int]],
                  served: Mapping[str, Served] | None = None) -> dict[str, dict[str, list[int]]]:
    """``{member: {topic: [partition, ...]}}``: the partition numbers in use, in order, split into contiguous
    runs over the members in name order (the first ones get one more when it does not divide), each member
    given its numbers in every topic it subscribes to. A partition whose owner does not subscribe to its topic
    (members of two versions during a rolling deploy) goes to one that does, by partition number.

    ``served``: the (saga type, version) pairs each member serves (a member missing serves none). Only the
    members that serve every pair any member serves share the partitions; the others get none. When no member
    serves them all, every member shares them (``covering`` tells which case it is)."""
    ordered = sorted(covering(served, subscriptions) if served is not None else subscriptions)
    wanted = {member: set(subscriptions[member]) for member in ordered}
    numbers = sorted({number for partitions in partitions_of.values() for number in partitions})
    assignment: dict[str, dict[str, list[int]]] = {member: {} for member in subscriptions}
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


def covering(served: Mapping[str, Served], members: Iterable[str]) -> list[str]:
    """The ``members`` that serve every pair any of them serves (those missing from ``served`` serve none);
    all of them when none does."""
    everyone = list(members)
    union: Served = frozenset().union(*(served.get(member, frozenset()) for member in everyone))
    full = [member for member in everyone if served.get(member, frozenset()) >= union]
    return full or everyone


def encode_served(served: Served) -> bytes:
    """``served`` as compact JSON, sorted: ``[["trip",1],["trip",2]]``."""
    return json.dumps(sorted([saga_type, version] for saga_type, version in served),
                      separators=(",", ":")).encode()


def decode_served(data: bytes) -> Served:
    """What ``encode_served`` wrote; empty bytes (a member that advertises nothing) or anything unreadable
    serve nothing."""
    if not data:
        return frozenset()
    try:
        pairs = json.loads(data)
        return frozenset((str(saga_type), int(version)) for saga_type, version in pairs)
    except (ValueError, TypeError):
        log.warning("unreadable served versions in a member's metadata", extra={"data": data[:200].decode(
            errors="replace")})
        return frozenset()


class GroupView:
    """What the group served at this member's last assignment, from the assignment's user data; a pair the
    group served within ``grace_s`` still counts (``SERVED_ELSEWHERE_GRACE_S``)."""

    def __init__(self, grace_s: float = SERVED_ELSEWHERE_GRACE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._grace_s = grace_s
        self._clock = clock
        self._current: Served = frozenset()
        self._seen_at: dict[tuple[str, int], float] = {}

    def assigned(self, served: Served) -> None:
        """A new assignment: the group serves ``served``."""
        now = self._clock()
        self._current = served
        for pair in served:
            self._seen_at[pair] = now

    def serves(self, saga_type: str, version: int) -> bool:
        """Whether a member of the group serves ``saga_type`` at ``version``, or did within the grace."""
        pair = (saga_type, version)
        if pair in self._current:
            return True
        seen = self._seen_at.get(pair)
        return seen is not None and self._clock() - seen <= self._grace_s


class CoPartitionedAssignor(AbstractPartitionAssignor):  # type: ignore[misc]  # aiokafka's base is untyped
    """The group's assignor: ``copartitioned`` over the topics the members subscribe to, among the members
    that serve the most versions. One per consumer: ``served`` is what this member advertises; ``view`` (if
    any) learns at each assignment what the group serves."""

    name = "saga-copartitioned"
    version = 0

    def __init__(self, served: Iterable[tuple[str, int]] = (), view: GroupView | None = None) -> None:
        self.served: Served = frozenset(served)
        self.view = view

    def assign(self, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
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
        served = {member: decode_served(metadata.user_data) for member, metadata in members.items()}
        union: Served = frozenset().union(*served.values())
        _log_coverage(served, union)
        split = copartitioned({member: metadata.subscription for member, metadata in members.items()},
                              partitions_of, served)
        group = encode_served(union)
        return {member: ConsumerProtocolMemberAssignment(self.version, sorted(split[member].items()), group)
                for member in members}

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(self.version, list(topics), encode_served(self.served))

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        if self.view is not None:
            self.view.assigned(decode_served(assignment.user_data))


def _names(pairs: Iterable[tuple[str, int]]) -> list[str]:
    return [f"{saga_type} v{version}" for saga_type, version in sorted(pairs)]


def _log_coverage(served: Mapping[str, Served], union: Served) -> None:
    """Once per rebalance (the leader's assign): which members wait without partitions, or what no member
    serves whole."""
    full = [member for member, pairs in served.items() if pairs >= union]
    if not full:
        log.warning("no member serves every definition version the group serves: the partitions are split "
                    "over all members, and a saga whose version its owner lacks is quarantined",
                    extra={"missing": {member: _names(union - pairs) for member, pairs in sorted(served.items())}})
    elif len(full) < len(served):
        log.info("members serving fewer definition versions get no partitions", extra={
            "waiting": {member: _names(union - pairs) for member, pairs in sorted(served.items())
                        if member not in full}})
