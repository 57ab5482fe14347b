"""Whether a worker consumes a topic, measured on the real broker: a stable group's member attends a topic; a topic
with records and no consumer is unattended, its waiting count past the highest offset any group committed."""

from __future__ import annotations

import contextlib

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from saga_orchestrator.infra.kafka_admin import TopicAttendance, settled_group, topic_attendance
from saga_orchestrator.infra.kafka_clients import KafkaClients

from .conftest import fresh_topic


async def _produce(bootstrap: str, topic: str, count: int, partition: int = 0) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for number in range(count):
            await producer.send_and_wait(topic, f"command {number}".encode(), partition=partition)
    finally:
        await producer.stop()


async def test_a_stable_consumer_attends_and_a_topic_without_one_says_what_waits(kafka_bootstrap: str,
                                                                                  topic_prefix: str) -> None:
    kafka = KafkaClients(kafka_bootstrap)
    attended = await fresh_topic(kafka_bootstrap, f"{topic_prefix}payment.commands", 2)
    deserted = await fresh_topic(kafka_bootstrap, f"{topic_prefix}notification.commands", 2)
    await _produce(kafka_bootstrap, attended, 2)
    await _produce(kafka_bootstrap, deserted, 5)
    await _produce(kafka_bootstrap, deserted, 1, partition=1)
    # A worker that once read the deserted topic and left: its committed offset counts, its group has no member.
    gone = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=f"{topic_prefix}gone",
                            enable_auto_commit=False)
    await gone.start()
    try:
        gone.assign([TopicPartition(deserted, 0)])
        await gone.commit({TopicPartition(deserted, 0): OffsetAndMetadata(2, "")})
    finally:
        await gone.stop()
    group = f"{topic_prefix}worker"
    worker = AIOKafkaConsumer(attended, bootstrap_servers=kafka_bootstrap, group_id=group,
                              auto_offset_reset="earliest")
    await worker.start()
    try:
        await settled_group(kafka, group, members=1)
        found = await topic_attendance(kafka, [attended, deserted, f"{topic_prefix}missing.commands"])
    finally:
        with contextlib.suppress(Exception):
            await worker.stop()

    assert found[attended].consumers == 1 and not found[attended].unattended
    assert found[deserted] == TopicAttendance(deserted, consumers=0, waiting=(5 - 2) + 1)
    assert found[deserted].unattended
    assert found[f"{topic_prefix}missing.commands"] == TopicAttendance(f"{topic_prefix}missing.commands")


async def test_a_broker_that_does_not_answer_leaves_every_topic_unknown() -> None:
    found = await topic_attendance(KafkaClients("127.0.0.1:1"), ["payment.commands"], seconds=1.0)
    assert found == {"payment.commands": TopicAttendance("payment.commands")}
    assert not found["payment.commands"].known
