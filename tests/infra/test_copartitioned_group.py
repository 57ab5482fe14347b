"""The orchestrators' assignor in a real consumer group: two members, partition k of every topic on one."""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

from saga_orchestrator.infra.kafka_admin import ensure_topics
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.orchestrator.assignment import CoPartitionedAssignor


def _numbers(consumer: AIOKafkaConsumer) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for tp in consumer.assignment():
        found.setdefault(tp.topic, set()).add(tp.partition)
    return found


async def test_two_members_split_every_topic_the_same_way(kafka_bootstrap: str, topic_prefix: str) -> None:
    kafka = KafkaClients(kafka_bootstrap)
    topics = [f"{topic_prefix}copart.{name}" for name in ("start", "control", "flight.results")]
    # 3 partitions: with an even count round robin would pair the numbers up across topics by chance
    await ensure_topics(kafka, topics, 3)
    members = [kafka.consumer(*topics, group_id=f"{topic_prefix}copart", enable_auto_commit=False,
                              partition_assignment_strategy=(CoPartitionedAssignor, RoundRobinPartitionAssignor))
               for _ in range(2)]
    for member in members:
        await member.start()
    try:
        deadline = time.monotonic() + 30
        while True:  # the second member's join makes the group rebalance; poll so that both take part
            await asyncio.gather(*(member.getmany(timeout_ms=200) for member in members))
            splits = [_numbers(member) for member in members]
            if all(splits) and sum(len(n) for split in splits for n in split.values()) == 9:
                break
            assert time.monotonic() < deadline, splits
    finally:
        for member in members:
            await member.stop()
    for split in splits:
        assert set(split) == set(topics)
        assert len({frozenset(numbers) for numbers in split.values()}) == 1, split  # same numbers everywhere
    first, second = (next(iter(split.values())) for split in splits)
    assert first.isdisjoint(second) and first | second == {0, 1, 2}
    assert sorted([len(first), len(second)]) == [1, 2]
