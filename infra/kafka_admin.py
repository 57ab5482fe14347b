"""Kafka administration: wait for a broker, create (or check) the topics a service needs, delete topics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError, for_code

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
