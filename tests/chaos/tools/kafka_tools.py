"""Kafka helpers for chaos tests: bulk publishing with positions, reading a topic whole, consumer-group lag."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, ConfigResource, ConfigResourceType

from infra.settings import Settings
from tests.chaos.tools.poison import PoisonRecord

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
    """Publish ``records`` through one batching producer; returns each one's partition and offset."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_servers(), acks="all", linger_ms=5,
                                max_batch_size=256 * 1024, max_request_size=max_request_size,
                                request_timeout_ms=60_000)
    await producer.start()
    try:
        futures = [await producer.send(r.topic, key=r.key, value=r.value, headers=list(r.headers))
                   for r in records]
        metadata = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return [Sent(r, m.partition, m.offset) for r, m in zip(records, metadata, strict=True)]


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
        partitions = [TopicPartition(topic, p) for p in sorted(await _partitions(consumer, topic))]
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


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    for _ in range(50):
        found = consumer.partitions_for_topic(topic)
        if found:
            return set(found)
        await consumer._client.force_metadata_update()  # the first lookup of a topic may come back empty
        await asyncio.sleep(0.1)
    raise LookupError(f"topic {topic} has no partitions")


async def group_lag(settings: Settings, group: str, topics: Iterable[str]) -> dict[TopicPartition, int]:
    """End offset minus the group's committed offset, per partition of ``topics`` (0 everywhere: caught up).

    A partition the group never committed counts its whole end offset as lag.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_servers())
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_servers(), enable_auto_commit=False)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
        partitions = [TopicPartition(t, p) for t in topics for p in sorted(await _partitions(consumer, t))]
        ends = await consumer.end_offsets(partitions)
        return {tp: ends[tp] - (committed[tp].offset if tp in committed else 0) for tp in partitions}
    finally:
        await consumer.stop()
        await admin.close()


async def wait_caught_up(settings: Settings, groups: dict[str, list[str]], timeout_s: float,
                         ) -> dict[str, dict[TopicPartition, int]]:
    """Poll until every group (id → topics) committed up to the end of every partition it consumes;
    returns what is still lagging (empty when all caught up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lagging = {}
        for group, topics in groups.items():
            lag = {tp: n for tp, n in (await group_lag(settings, group, topics)).items() if n > 0}
            if lag:
                lagging[group] = lag
        if not lagging or time.monotonic() >= deadline:
            return lagging
        await asyncio.sleep(0.5)
