"""The real broker: consumer groups with committed offsets, and transactions (aiokafka against Kafka 4.1)."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from saga_orchestrator.infra.kafka_admin import ensure_topics
from saga_orchestrator.infra.kafka_clients import KafkaClients

MESSAGES = 1000
PROCESSED_BY_FIRST = 400


async def _produce_numbers(bootstrap: str, topic: str, count: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    await producer.start()
    try:
        pending = [
            await producer.send(topic, key=str(number % 7).encode(), value=str(number).encode())
            for number in range(count)
        ]
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def _group_consumer(bootstrap: str, topic: str, group: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )


async def test_second_consumer_of_a_group_resumes_from_the_committed_offsets(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic, group = f"{topic_prefix}numbers", f"{topic_prefix}numbers-group"
    await ensure_topics(KafkaClients(kafka_bootstrap), [topic], 3)
    await ensure_topics(KafkaClients(kafka_bootstrap), [topic], 3)  # a second call is a no-op
    await _produce_numbers(kafka_bootstrap, topic, MESSAGES)

    first_seen: set[int] = set()
    next_offsets: dict[TopicPartition, int] = {}
    first = _group_consumer(kafka_bootstrap, topic, group)
    await first.start()
    try:
        async with asyncio.timeout(30):
            while len(first_seen) < PROCESSED_BY_FIRST:
                batches = await first.getmany(timeout_ms=500, max_records=100)
                for partition, records in batches.items():
                    for record in records:
                        if len(first_seen) == PROCESSED_BY_FIRST:
                            break  # fetched but not processed: must come again to the next consumer
                        first_seen.add(int(record.value))
                        next_offsets[partition] = record.offset + 1
        await first.commit(next_offsets)
    finally:
        await first.stop()

    second_seen: set[int] = set()
    second = _group_consumer(kafka_bootstrap, topic, group)
    await second.start()
    try:
        for partition, offset in next_offsets.items():
            assert await second.committed(partition) == offset
        async with asyncio.timeout(30):
            while len(first_seen) + len(second_seen) < MESSAGES:
                batches = await second.getmany(timeout_ms=500)
                for records in batches.values():
                    second_seen.update(int(record.value) for record in records)
    finally:
        await second.stop()

    assert len(first_seen) == PROCESSED_BY_FIRST
    assert first_seen.isdisjoint(second_seen)
    assert first_seen | second_seen == set(range(MESSAGES))


async def _read_until(bootstrap: str, topic: str, isolation_level: str, last: bytes) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        isolation_level=isolation_level,
        enable_auto_commit=False,
    )
    values: list[bytes] = []
    await consumer.start()
    try:
        async with asyncio.timeout(30):
            while last not in values:
                batches = await consumer.getmany(timeout_ms=500)
                for records in batches.values():
                    values.extend(record.value for record in records)
    finally:
        await consumer.stop()
    return values


async def test_read_committed_consumer_sees_committed_transactions_only(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}transactions"
    await ensure_topics(KafkaClients(kafka_bootstrap), [topic], 1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"{topic_prefix}tx")
    await producer.start()
    try:
        async with producer.transaction():
            for number in range(3):
                await producer.send(topic, f"committed-{number}".encode())
        await producer.begin_transaction()
        for number in range(3):
            await producer.send(topic, f"aborted-{number}".encode())
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send(topic, b"last")
    finally:
        await producer.stop()

    committed = await _read_until(kafka_bootstrap, topic, "read_committed", b"last")
    assert committed == [b"committed-0", b"committed-1", b"committed-2", b"last"]
    # The aborted records were written to the log; only the isolation level hides them.
    uncommitted = await _read_until(kafka_bootstrap, topic, "read_uncommitted", b"last")
    assert b"aborted-0" in uncommitted
