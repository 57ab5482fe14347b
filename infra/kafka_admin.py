"""Kafka administration: wait for a broker, create (or check) the topics a service needs, delete topics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import (
    LeaderNotAvailableError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    for_code,
)
from aiokafka.protocol.offset import OffsetRequest
from aiokafka.structs import TopicPartition

from .kafka_clients import KafkaClients
from .misconfigured import Misconfigured

_NO_ERROR = 0


@dataclass(frozen=True)
class TopicLayout:
    """How the services create their topics (SAGA_TOPIC_PARTITIONS, SAGA_TOPIC_REPLICATION_FACTOR,
    SAGA_TOPIC_MIN_INSYNC_REPLICAS), or, with ``create`` off (SAGA_CREATE_TOPICS=false), only check them."""

    partitions: int
    replication_factor: int = 1
    min_insync_replicas: int | None = None
    create: bool = True

    def configs(self) -> dict[str, str]:
        return {} if self.min_insync_replicas is None else {"min.insync.replicas": str(self.min_insync_replicas)}


class TopicsMissing(Misconfigured):
    """SAGA_CREATE_TOPICS is off and topics the service needs do not exist (or have too few partitions)."""


class PartitionsDisagree(Misconfigured):
    """A topic has another partition count than SAGA_TOPIC_PARTITIONS says: processes disagree on it."""


async def broker_answers(kafka: KafkaClients, seconds: float = 5.0) -> bool:
    """Whether a broker of ``kafka`` answers a metadata request within `seconds`."""
    admin = kafka.admin(request_timeout_ms=int(seconds * 1000), client_id="saga-probe")
    try:
        async with asyncio.timeout(seconds):
            await admin.start()
            cluster = await admin.describe_cluster()
        return bool(cluster.get("brokers"))
    except Exception:  # refused, reset, timed out, no brokers: it does not answer
        return False
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def wait_for_broker(kafka: KafkaClients, seconds: float, alive: Callable[[], bool] | None = None) -> bool:
    """Poll until the broker answers (True), or `seconds` pass or `alive()` turns False (False)."""
    deadline = time.monotonic() + seconds
    # aiokafka logs every refused connection at ERROR; while we poll a starting broker that is expected.
    client_log = logging.getLogger("aiokafka")
    previous_level = client_log.level
    client_log.setLevel(logging.CRITICAL)
    try:
        while time.monotonic() < deadline:
            if alive is not None and not alive():
                return False
            if await broker_answers(kafka, seconds=min(5.0, max(0.5, deadline - time.monotonic()))):
                return True
            await asyncio.sleep(0.2)
        return False
    finally:
        client_log.setLevel(previous_level)


async def ensure_topics(kafka: KafkaClients, names: list[str], layout: TopicLayout | int,
                        seconds: float = 30.0) -> None:
    """Create the topics that do not exist yet (idempotent) and wait until each partition has a leader; with
    ``layout.create`` off, raise TopicsMissing naming every topic that is missing or has fewer than
    ``layout.partitions`` partitions. ``layout`` may be a partition count (one replica).

    An existing topic with another partition count than ``layout.partitions`` is refused (PartitionsDisagree):
    a saga's partition is its key's hash modulo SAGA_TOPIC_PARTITIONS, in every process (durable timers and
    outbox shards follow it), so every process of a deployment must use the count its topics were made with.
    A concurrent creator winning the race (TopicAlreadyExists) is fine.
    """
    layout = layout if isinstance(layout, TopicLayout) else TopicLayout(layout)
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return
    async with kafka.started_admin(client_id="saga-topics") as admin:
        existing = set(await admin.list_topics())
        missing = [name for name in wanted if name not in existing]
        counts = await _partition_counts(admin, [name for name in wanted if name in existing])
        if not layout.create:
            short = {name: count for name, count in counts.items() if count < layout.partitions}
            if missing or short:
                raise TopicsMissing(_missing_message(missing, short, layout.partitions))
        differ = {name: count for name, count in counts.items() if count != layout.partitions}
        if differ:
            raise PartitionsDisagree(
                f"SAGA_TOPIC_PARTITIONS={layout.partitions}, but "
                + ", ".join(f"{name} has {count}" for name, count in sorted(differ.items()))
                + ": every process of a deployment must use the SAGA_TOPIC_PARTITIONS its topics were made with")
        if layout.create and missing:
            response = await admin.create_topics(
                [NewTopic(name, layout.partitions, layout.replication_factor, topic_configs=layout.configs())
                 for name in missing],
                timeout_ms=int(seconds * 1000),
            )
            for topic, code, *_message in response.topic_errors:
                if code not in (_NO_ERROR, TopicAlreadyExistsError.errno):
                    raise for_code(code)(f"creating topic {topic}")
        await _wait_for_leaders(admin, wanted, time.monotonic() + seconds)


async def delete_topics(kafka: KafkaClients, names: list[str] | None = None, *, prefix: str | None = None) -> list[str]:
    """Delete the topics ``names``, or every topic whose name starts with ``prefix`` (not empty); returns the
    names it asked the broker to delete."""
    if (names is None) == (prefix is None) or prefix == "":
        raise ValueError("give the topic names or a non-empty prefix")
    async with kafka.started_admin(client_id="saga-topics") as admin:
        doomed = names if names is not None else [
            name for name in await admin.list_topics() if prefix is not None and name.startswith(prefix)]
        if doomed:
            await admin.delete_topics(doomed)
        return doomed


async def _partition_counts(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    """How many partitions each topic of ``names`` has."""
    if not names:
        return {}
    return {topic["topic"]: len(topic["partitions"]) for topic in await admin.describe_topics(names)}


def _missing_message(missing: list[str], short: dict[str, int], partitions: int) -> str:
    parts = []
    if missing:
        parts.append(f"these topics do not exist: {', '.join(missing)}")
    if short:
        parts.append("these have fewer than SAGA_TOPIC_PARTITIONS=" + str(partitions) + " partitions: "
                     + ", ".join(f"{name} ({count})" for name, count in sorted(short.items())))
    return ("SAGA_CREATE_TOPICS is off and " + "; ".join(parts)
            + f". Create them with {partitions} partitions each, or set SAGA_CREATE_TOPICS=true")


async def _wait_for_leaders(admin: AIOKafkaAdminClient, names: list[str], deadline: float) -> None:
    """Metadata reaches the broker shortly after the controller commits a topic; wait for it."""
    while True:
        described = await admin.describe_topics(names)
        pending = [
            topic["topic"]
            for topic in described
            if topic["error_code"] != _NO_ERROR
            or not topic["partitions"]
            or any(partition["leader"] < 0 for partition in topic["partitions"])
        ]
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"topics without a leader: {', '.join(sorted(pending))}")
        await asyncio.sleep(0.1)


async def topic_retention_ms(kafka: KafkaClients, names: list[str], seconds: float = 10.0) -> dict[str, int]:
    """Each topic's ``retention.ms`` as the broker reports it (-1: kept forever); topics that do not exist are
    left out.

    In a cluster the broker that answers may not know a topic another broker has just listed (its metadata
    lags the controller's by a moment): such a topic is asked again for up to ``seconds``.
    """
    if not names:
        return {}
    deadline = time.monotonic() + seconds
    found: dict[str, int] = {}
    async with kafka.started_admin(client_id="saga-topics") as admin:
        existing = set(await admin.list_topics())
        wanted = [name for name in dict.fromkeys(names) if name in existing]
        while wanted:
            responses = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, name, configs={"retention.ms": None}) for name in wanted])
            wanted = []
            for response in responses:
                for code, message, _type, name, entries, *_ in response.resources:
                    if code == UnknownTopicOrPartitionError.errno and time.monotonic() < deadline:
                        wanted.append(name)
                    elif code != _NO_ERROR:
                        raise for_code(code)(f"reading the configuration of topic {name}: {message}")
                    for key, value, *_ in entries:
                        if key == "retention.ms" and value is not None:
                            found[name] = int(value)
            if wanted:
                await asyncio.sleep(0.1)
    return found


class RetentionTooShort(Misconfigured):
    """A service would keep its idempotency records shorter than a topic it reads keeps its records."""


async def check_retention(kafka: KafkaClients, topics: list[str], setting: str, hours: float) -> None:
    """Raise RetentionTooShort (which says what to change) unless records kept ``hours`` (``setting``) outlive
    the records of ``topics``."""
    problem = retention_problem(setting, hours, await topic_retention_ms(kafka, topics) if hours else {})
    if problem is not None:
        raise RetentionTooShort(problem)


def retention_problem(setting: str, hours: float, retentions_ms: dict[str, int]) -> str | None:
    """Why idempotency records kept ``hours`` (setting ``setting``; 0 keeps them forever) do not outlive the
    records of the topics a service reads, or None: a record read again after its idempotency record is gone
    would be handled twice."""
    if hours == 0:
        return None
    kept_ms = hours * 3_600_000
    longer = {name: ms for name, ms in retentions_ms.items() if ms < 0 or ms > kept_ms}
    if not longer:
        return None
    name, ms = max(longer.items(), key=lambda item: (item[1] < 0, item[1]))
    kept = "forever" if ms < 0 else f"{ms / 3_600_000:g} h"
    fix = "0 (keep them)" if ms < 0 else f"at least {ms / 3_600_000:g} (or 0 to keep them)"
    return (f"{setting.upper()}={hours:g} keeps idempotency records {hours:g} h, but topic {name} keeps its records "
            f"{kept}: a record read again after its idempotency record is gone would be handled twice. Set "
            f"{setting.upper()} to {fix}, or lower the topic's retention.ms")


async def group_members(kafka: KafkaClients, group: str) -> list[set[int]]:
    """The partition numbers each member of consumer group ``group`` is assigned (empty while it rebalances)."""
    async with kafka.started_admin() as admin:
        [response] = await admin.describe_consumer_groups([group])
    members = []
    for _error, _group, state, _type, _protocol, found, *_ in response.groups:
        if state != "Stable":
            return []
        for _id, *_client, assignment in found:
            decoded = ConsumerProtocolMemberAssignment.decode(assignment)
            members.append({number for _topic, numbers in decoded.assignment for number in numbers})
    return members


async def settled_group(kafka: KafkaClients, group: str, members: int, timeout_s: float = 60) -> list[set[int]]:
    """The partitions of each member once ``group`` is stable with ``members`` members, each with some;
    TimeoutError naming what it saw when that takes longer than ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while len(found := await group_members(kafka, group)) != members or not all(found):
        if time.monotonic() > deadline:
            raise TimeoutError(f"consumer group {group} did not settle with {members} members: {found}")
        await asyncio.sleep(0.5)
    return found


MAX_GROUPS = 500
"""The most consumer groups ``topic_attendance`` asks about (two requests each, concurrently); past it, it answers
unknown."""


@dataclass(frozen=True)
class TopicAttendance:
    """Who reads topic ``topic``. ``consumers``: the members of stable consumer groups assigned any of its
    partitions; ``waiting``: its records past the highest offset any group committed for each partition (past
    its beginning where none did). None: unknown (the broker did not answer in time, or the topic is missing)."""

    topic: str
    consumers: int | None = None
    waiting: int | None = None

    @property
    def known(self) -> bool:
        return self.consumers is not None and self.waiting is not None

    @property
    def unattended(self) -> bool:
        """Known to have no consumer while records wait on it."""
        return self.consumers == 0 and (self.waiting or 0) > 0


class TooManyGroups(Exception):
    """More consumer groups than ``topic_attendance`` asks about."""


async def topic_attendance(kafka: KafkaClients, topics: Sequence[str],
                           seconds: float = 5.0) -> dict[str, TopicAttendance]:
    """The attendance of each of ``topics``, from one admin client in at most ``seconds``: every topic unknown
    when the brokers do not answer in time or fail (never an exception).

    Calls: the cluster's metadata, then per broker its groups (ListGroups) and the first and last offsets of the
    partitions it leads; per consumer group (concurrently) its description and its committed offsets for these
    topics; with more than MAX_GROUPS groups, every topic is unknown. A member's assignment decodes as the
    consumer protocol's (faust's assignor writes the same, with its own data in ``user_data``); a group that is
    rebalancing counts no members.
    """
    wanted = list(dict.fromkeys(topics))
    unknown = {name: TopicAttendance(name) for name in wanted}
    if not wanted:
        return {}
    admin = kafka.admin(request_timeout_ms=int(seconds * 1000), client_id="saga-attendance")
    try:
        async with asyncio.timeout(seconds):
            await admin.start()
            return {**unknown, **await _attendance(admin, wanted)}
    except Exception as error:  # the broker away, slow or refusing: unknown, which the caller shows as such
        logging.getLogger(__name__).debug("topic attendance unknown: %r", error)
        return unknown
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def _attendance(admin: AIOKafkaAdminClient, topics: list[str]) -> dict[str, TopicAttendance]:
    """The attendance of the ``topics`` that exist (see ``topic_attendance``)."""
    # One request for brokers and leaders both; for every topic, as naming one could auto-create it.
    metadata = (await admin._get_cluster_metadata()).to_object()
    brokers = [broker["node_id"] for broker in metadata["brokers"]]
    leaders: dict[int, list[tuple[str, int]]] = {}
    partitions: list[tuple[str, int]] = []
    wanted = set(topics)
    for topic in metadata["topics"]:
        if topic["topic"] in wanted:
            for partition in topic["partitions"]:
                key = (topic["topic"], partition["partition"])
                if partition["leader"] < 0:
                    raise LeaderNotAvailableError(f"{key[0]}-{key[1]} has no leader")
                leaders.setdefault(partition["leader"], []).append(key)
                partitions.append(key)
    groups_by_broker = await asyncio.gather(*(admin.list_consumer_groups([broker]) for broker in brokers))
    # "": a group that only commits offsets (its consumers assign partitions themselves); it has no members.
    coordinated = {broker: sorted(group for group, protocol, *_ in found if protocol in ("consumer", ""))
                   for broker, found in zip(brokers, groups_by_broker, strict=True)}
    everyone = [(broker, group) for broker, groups in coordinated.items() for group in groups]
    if len(everyone) > MAX_GROUPS:
        raise TooManyGroups(f"{len(everyone)} consumer groups, more than {MAX_GROUPS}")
    # One group per DescribeGroups request: aiokafka 0.14 cannot decode a Kafka 4 broker's answer about several.
    described = await asyncio.gather(*(admin.describe_consumer_groups([group], group_coordinator_id=broker)
                                       for broker, group in everyone))
    consumers = dict.fromkeys(topics, 0)
    for responses in described:
        for response in responses:
            for _error, _group, state, _type, _protocol, members, *_ in response.groups:
                if state != "Stable":
                    continue
                for *_member, assignment in members:
                    decoded = ConsumerProtocolMemberAssignment.decode(assignment)
                    for name in {topic for topic, numbers in decoded.assignment if numbers and topic in wanted}:
                        consumers[name] += 1
    asked = [TopicPartition(name, number) for name, number in partitions]
    committed: dict[tuple[str, int], int] = {}
    for offsets in await asyncio.gather(*(admin.list_consumer_group_offsets(group, broker, asked)
                                          for broker, group in everyone)):
        for tp, offset in offsets.items():
            if offset.offset >= 0:
                committed[(tp.topic, tp.partition)] = max(offset.offset, committed.get((tp.topic, tp.partition), 0))
    first, last = await _offsets(admin, leaders, _EARLIEST), await _offsets(admin, leaders, _LATEST)
    waiting = dict.fromkeys(topics, 0)
    for key in partitions:
        waiting[key[0]] += max(0, last[key] - committed.get(key, first[key]))
    present = {name for name, _number in partitions}
    return {name: TopicAttendance(name, consumers[name], waiting[name]) for name in topics if name in present}


_EARLIEST, _LATEST = -2, -1  # ListOffsets' timestamps that ask for a partition's first and next offsets


async def _offsets(admin: AIOKafkaAdminClient, leaders: dict[int, list[tuple[str, int]]],
                   at: int) -> dict[tuple[str, int], int]:
    """The offset ``at`` names of each partition, asked of its leader (one request per leader)."""

    async def ask(leader: int, partitions: list[tuple[str, int]]) -> Any:
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for name, number in partitions:
            by_topic.setdefault(name, []).append((number, at))
        return await admin._send_request(OffsetRequest(-1, 0, list(by_topic.items())), leader)

    found: dict[tuple[str, int], int] = {}
    for response in await asyncio.gather(*(ask(leader, partitions) for leader, partitions in leaders.items())):
        for name, answers in response.topics:
            for number, code, *offset in answers:
                if code != _NO_ERROR:
                    raise for_code(code)(f"reading the offsets of {name}-{number}")
                value = offset[-1]  # v0 answers a list of offsets, later versions (timestamp, offset)
                found[(name, number)] = int(value[0] if isinstance(value, list) else value)
    return found
