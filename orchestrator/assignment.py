"""How several orchestrators share the topics they read: partition k of every topic goes to one instance.

A saga's StartSaga, its control messages and its participants' replies all carry the saga id as key, and
every topic of a deployment has SAGA_TOPIC_PARTITIONS partitions, so they all land on the same partition
number. Giving one instance partition k of every topic (as Kafka Streams does for co-partitioned topics)
keeps each saga on one instance: its state stays in that instance's cache, and two instances never race to
append the same saga's next event. aiokafka's default (round robin) deals the partitions of each topic out
separately, which would split a saga's topics over instances.

During a rolling deploy the instances serve different definition versions, or one version with and without a
patch marker, and a saga is pinned to the version and shape it started on (or reached through a patch): an
instance that lacks them would quarantine the saga. So each member advertises the (saga type, version, shape
fingerprint) triples it serves in its member metadata, every shape of every definition it registered, and the
partitions go only to the members that serve every shape any member serves; the others wait, with none, until
the new version or patch is everywhere (or the members that have it leave). Each member's assignment carries
back what the whole group serves (``GroupView``), so an instance that still meets a saga of a version or shape it
lacks knows whether another member serves it.
"""


from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

from .domain.definition import SagaDefinition

log = logging.getLogger("saga.orchestrator.assignment")

Shape = tuple[str, int, str]
"""A (saga type, definition version, shape fingerprint) a saga may run on: ``SagaDefinition.shapes``."""

Served = frozenset[Shape]
"""The shapes a member can decide: every shape of every definition it registered."""

SERVED_ELSEWHERE_GRACE_S = 60.0
"""How long a version or shape the group served is still counted as served after the members serving it left: the time
an instance of the new version takes to restart during a rolling deploy. Its sagas' messages wait meanwhile
instead of being quarantined; after it, a version or shape no member serves quarantines its sagas as before."""


def shapes_of(definitions: Iterable[SagaDefinition]) -> Served:
    """What a member with ``definitions`` registered serves: each one's every shape (``SagaDefinition.shapes``)."""
    return frozenset((d.saga_type, d.version, fingerprint) for d in definitions for fingerprint in d.shapes)


def copartitioned(subscriptions: Mapping[str, Iterable[str]], partitions_of: Mapping[str, Iterable[int]],
                  served: Mapping[str, Served] | None = None) -> dict[str, dict[str, list[int]]]:
    """``{member: {topic: [partition, ...]}}``: the partition numbers in use, in order, split into contiguous
    runs over the members in name order (the first ones get one more when it does not divide), each member
    given its numbers in every topic it subscribes to. A partition whose owner does not subscribe to its topic
    (members of two versions during a rolling deploy) goes to one that does, by partition number.

    ``served``: the shapes each member serves (a member missing serves none). Only the members that serve
    every shape any member serves share the partitions; the others get none. When no member
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
    """The ``members`` that serve every shape any of them serves (those missing from ``served`` serve none);
    all of them when none does."""
    everyone = list(members)
    union: Served = frozenset().union(*(served.get(member, frozenset()) for member in everyone))
    full = [member for member in everyone if served.get(member, frozenset()) >= union]
    return full or everyone


def encode_served(served: Served) -> bytes:
    """``served`` as compact JSON, sorted: ``[["trip",1,"22d3..."],["trip",2,"9a41..."]]``."""
    return json.dumps(sorted([saga_type, version, fingerprint] for saga_type, version, fingerprint in served),
                      separators=(",", ":")).encode()


def decode_served(data: bytes) -> Served:
    """What ``encode_served`` wrote; empty bytes (a member that advertises nothing) or anything unreadable
    serve nothing."""
    if not data:
        return frozenset()
    try:
        triples = json.loads(data)
        return frozenset((str(saga_type), int(version), str(fingerprint))
                         for saga_type, version, fingerprint in triples)
    except (ValueError, TypeError):
        log.warning("unreadable served shapes in a member's metadata", extra={"data": data[:200].decode(
            errors="replace")})
        return frozenset()


class GroupView:
    """What the group served at this member's last assignment, from the assignment's user data; a shape the
    group served within ``grace_s`` still counts (``SERVED_ELSEWHERE_GRACE_S``)."""

    def __init__(self, grace_s: float = SERVED_ELSEWHERE_GRACE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._grace_s = grace_s
        self._clock = clock
        self._current: Served = frozenset()
        self._seen_at: dict[Shape, float] = {}

    def assigned(self, served: Served) -> None:
        """A new assignment: the group serves ``served``."""
        now = self._clock()
        self._current = served
        for shape in served:
            self._seen_at[shape] = now

    def serves(self, saga_type: str, version: int, fingerprint: str | None = None) -> bool:
        """Whether a member of the group serves ``saga_type`` at ``version``, or did within the grace: the shape
        ``fingerprint`` of it, or (None) any shape of it."""
        def wanted(shape: Shape) -> bool:
            return shape[:2] == (saga_type, version) and fingerprint in (None, shape[2])

        if any(wanted(shape) for shape in self._current):
            return True
        now = self._clock()
        return any(wanted(shape) and now - seen <= self._grace_s for shape, seen in self._seen_at.items())


class CoPartitionedAssignor(AbstractPartitionAssignor):  # type: ignore[misc]  # aiokafka's base is untyped
    """The group's assignor: ``copartitioned`` over the topics the members subscribe to, among the members
    that serve the most shapes. One per consumer: ``served`` is what this member advertises; ``view`` (if
    any) learns at each assignment what the group serves."""

    name = "saga-copartitioned"
    version = 0

    def __init__(self, served: Iterable[Shape] = (), view: GroupView | None = None) -> None:
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


def _names(shapes: Iterable[Shape]) -> list[str]:
    return [f"{saga_type} v{version} shape {fingerprint[:12]}" for saga_type, version, fingerprint in sorted(shapes)]


def _log_coverage(served: Mapping[str, Served], union: Served) -> None:
    """Once per rebalance (the leader's assign): which members wait without partitions, or what no member
    serves whole."""
    full = [member for member, shapes in served.items() if shapes >= union]
    if not full:
        log.warning("no member serves every definition version and shape the group serves: the partitions are "
                    "split over all members, and a saga whose version or shape its owner lacks is quarantined",
                    extra={"missing": {member: _names(union - shapes) for member, shapes in sorted(served.items())}})
    elif len(full) < len(served):
        log.info("members serving fewer definition versions or shapes get no partitions", extra={
            "waiting": {member: _names(union - shapes) for member, shapes in sorted(served.items())
                        if member not in full}})
