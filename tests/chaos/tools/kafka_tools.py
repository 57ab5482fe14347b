"""Kafka helpers for chaos tests: bulk publishing with positions, reading a topic whole, consumer-group lag."""

from __future__ import annotations

import asyncio
import random
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy

from saga_orchestrator.client.saga_client import topic_partitions
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.participants.trip import PARTICIPANTS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.topics import Topics
from tests.chaos.tools.poison import PoisonFactory, PoisonRecord

LARGE_REQUEST = 4 * 1024 * 1024  # lets the producer hand the broker records above the 1 MiB default


@dataclass(frozen=True)
class Sent:
    """A published record and where Kafka put it."""

    record: PoisonRecord
    partition: int
    offset: int

    @property
    def position(self) -> tuple[str, int, int]:
        return self.record.topic, self.partition, self.offset


async def publish_records(settings: Settings, records: Sequence[PoisonRecord],
                          max_request_size: int = LARGE_REQUEST) -> list[Sent]:
    """Publish ``records`` in batches built per partition (cheap for the test process, which shares the
    machine with the system under test); returns each one's partition and offset.

    A keyed record goes to a partition chosen by a hash of its key (not Kafka's murmur2: poison needs no
    co-location with real messages of that key), an unkeyed one to a random partition.
    """
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_servers(), acks="all",
                                max_batch_size=512 * 1024, max_request_size=max_request_size,
                                request_timeout_ms=60_000)
    await producer.start()
    try:
        groups: dict[tuple[str, int], list[int]] = {}
        for index, record in enumerate(records):
            partitions = await _producer_partitions(producer, record.topic)
            chosen = (zlib.crc32(record.key) if record.key is not None else random.randrange(1 << 30))
            groups.setdefault((record.topic, partitions[chosen % len(partitions)]), []).append(index)
        placed: dict[int, tuple[int, int]] = {}
        futures = []
        for (topic, partition), indexes in groups.items():
            for batch_indexes, batch in _batches(producer, [records[i] for i in indexes], indexes):
                futures.append((partition, batch_indexes, await producer.send_batch(batch, topic, partition=partition)))
        for partition, batch_indexes, future in futures:
            base = (await future).offset
            placed.update((i, (partition, base + n)) for n, i in enumerate(batch_indexes))
    finally:
        await producer.stop()
    return [Sent(record, *placed[index]) for index, record in enumerate(records)]


def _batches(producer: AIOKafkaProducer, records: list[PoisonRecord],
             indexes: list[int]) -> Iterator[tuple[list[int], Any]]:
    """Record batches (aiokafka BatchBuilders) in order; the first record of a batch always fits."""
    batch, members = producer.create_batch(), list[int]()
    for record, index in zip(records, indexes, strict=True):
        if batch.append(key=record.key, value=record.value, timestamp=None, headers=list(record.headers)) is None:
            yield members, batch
            batch, members = producer.create_batch(), list[int]()
            batch.append(key=record.key, value=record.value, timestamp=None, headers=list(record.headers))
        members.append(index)
    if members:
        yield members, batch


async def _producer_partitions(producer: AIOKafkaProducer, topic: str) -> list[int]:
    await producer.client._wait_on_metadata(topic)
    return sorted(producer.client.cluster.partitions_for_topic(topic))


async def set_max_message_bytes(settings: Settings, topics: Iterable[str], size: int) -> None:
    """Raise (or lower) the largest record batch the given topics accept (an operator's topic setting)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_servers())
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic,
                                                  configs={"max.message.bytes": str(size)}) for topic in topics])
    finally:
        await admin.close()


async def read_all(settings: Settings, topic: str, timeout_s: float = 30.0) -> list[ConsumerRecord]:
    """Every record on ``topic`` up to its end offsets at the time of the call."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_servers(), enable_auto_commit=False,
                                max_partition_fetch_bytes=4 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in await topic_partitions(consumer, topic)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + timeout_s
        pending = {tp for tp in partitions if ends[tp] > 0}
        while pending and time.monotonic() < deadline:
            for tp, batch in (await consumer.getmany(*pending, timeout_ms=200, max_records=5000)).items():
                records.extend(r for r in batch if r.offset < ends[tp])
            pending = {tp for tp in pending if await consumer.position(tp) < ends[tp]}
        if pending:
            raise TimeoutError(f"{topic}: could not read to the end of {sorted(tp.partition for tp in pending)}")
        return records
    finally:
        await consumer.stop()


class LagWatch:
    """Consumer-group lag (end offset minus committed offset) of several groups, with one admin client and
    one consumer kept open between looks. A partition a group never committed lags by its whole end."""

    def __init__(self, settings: Settings, groups: dict[str, list[str]]) -> None:
        self.groups = groups
        self._admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_servers())
        self._consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_servers(), enable_auto_commit=False)
        self._partitions: dict[str, list[TopicPartition]] = {}

    async def __aenter__(self) -> LagWatch:
        await self._admin.start()
        await self._consumer.start()
        for group, topics in self.groups.items():
            self._partitions[group] = [TopicPartition(t, p) for t in topics
                                       for p in await topic_partitions(self._consumer, t)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()
        await self._admin.close()

    async def lagging(self) -> dict[str, dict[TopicPartition, int]]:
        """Partitions with a lag, per group (empty: every group caught up)."""
        ends = await self._consumer.end_offsets([tp for tps in self._partitions.values() for tp in tps])
        found: dict[str, dict[TopicPartition, int]] = {}
        for group, partitions in self._partitions.items():
            committed = await self._admin.list_consumer_group_offsets(group)
            lag = {tp: ends[tp] - (committed[tp].offset if tp in committed else 0) for tp in partitions}
            if any(n > 0 for n in lag.values()):
                found[group] = {tp: n for tp, n in lag.items() if n > 0}
        return found

    async def wait(self, timeout_s: float, max_lag: int = 0) -> dict[str, dict[TopicPartition, int]]:
        """Poll until the groups are at most ``max_lag`` records behind in total; returns what still lags
        when time is up (empty when they caught up)."""
        deadline = time.monotonic() + timeout_s
        while True:
            lagging = await self.lagging()
            if sum(n for lag in lagging.values() for n in lag.values()) <= max_lag:
                return {}
            if time.monotonic() >= deadline:
                return lagging
            await asyncio.sleep(0.1)


async def wait_caught_up(settings: Settings, groups: dict[str, list[str]], timeout_s: float,
                         max_lag: int = 0) -> dict[str, dict[TopicPartition, int]]:
    """Wait until every group (id → topics) committed to within ``max_lag`` records of the end of the
    partitions it consumes (0: all of them); returns what still lags (empty when caught up)."""
    async with LagWatch(settings, groups) as watch:
        return await watch.wait(timeout_s, max_lag)


async def dead_letter_positions(settings: Settings) -> set[tuple[str, int, int]]:
    """Source (topic, partition, offset) of every dead letter on saga.dlq so far."""
    records = await read_all(settings, Topics(settings.saga_topic_prefix).dlq)
    letters = [wire.decode_dead_letter(r.value) for r in records]
    return {(x.source_topic, x.source_partition, x.source_offset) for x in letters}


async def wait_consumers_up(settings: Settings, timeout_s: float = 90.0,
                            participants: tuple[str, ...] = PARTICIPANTS) -> list[Sent]:
    """Publish one malformed record to every consumed topic and wait until each is dead-lettered: then the
    orchestrator and every participant consume (and their relays publish). Returns what was sent."""
    factory = PoisonFactory(Topics(settings.saga_topic_prefix), participants, seed=1,
                            run_id=f"warm-up-{random.randrange(1 << 30):x}")
    sent = await publish_records(settings, [factory.make("random_bytes", topic) for topic in factory.roles()])
    wanted = {s.position for s in sent}
    deadline = time.monotonic() + timeout_s
    while not wanted <= await dead_letter_positions(settings):
        if time.monotonic() >= deadline:
            raise TimeoutError("the services did not dead-letter the warm-up records: not all are up")
        await asyncio.sleep(0.5)
    return sent


class _RawHeaderName(str):
    """A header name whose wire bytes are not UTF-8 (legal in Kafka; aiokafka only writes str names)."""

    def __new__(cls, raw: bytes) -> _RawHeaderName:
        name = super().__new__(cls, raw.decode("utf-8", "replace"))
        name.raw = raw
        return name

    raw: bytes

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


async def publish_with_raw_header_name(settings: Settings, topic: str, partition: int, key: bytes, value: bytes,
                                       header_name: bytes) -> int:
    """Publish one record whose header name is the given bytes (e.g. not UTF-8); returns its offset.

    aiokafka's C record builder insists on str names, so this batch is built by its pure-Python builder.
    """
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_servers())
    await producer.start()
    try:
        batch = producer.create_batch()
        batch._builder = _DefaultRecordBatchBuilderPy(
            magic=2, compression_type=0, is_transactional=0, producer_id=-1, producer_epoch=-1,
            base_sequence=-1, batch_size=1024 * 1024)
        batch.append(key=key, value=value, timestamp=None, headers=[(_RawHeaderName(header_name), b"1")])
        offset: int = (await (await producer.send_batch(batch, topic, partition=partition))).offset
        return offset
    finally:
        await producer.stop()
