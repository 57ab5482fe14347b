"""Topics on the real broker as the settings ask for them: created with their layout, or only checked."""

from __future__ import annotations

import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError

from saga_orchestrator.infra.kafka_admin import PartitionsDisagree, TopicLayout, TopicsMissing, ensure_topics
from saga_orchestrator.infra.kafka_clients import KafkaClients


async def _min_insync(kafka: KafkaClients, topic: str) -> str | None:
    async with kafka.started_admin() as admin:
        [response] = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, configs={"min.insync.replicas": None})])
    for _code, _message, _type, _name, entries, *_ in response.resources:
        for key, value, *_rest in entries:
            if key == "min.insync.replicas":
                return str(value)
    return None


async def test_topics_are_created_with_the_layout(kafka_bootstrap: str, topic_prefix: str) -> None:
    kafka = KafkaClients(kafka_bootstrap)
    topic = f"{topic_prefix}laid-out"
    await ensure_topics(kafka, [topic], TopicLayout(3, replication_factor=1, min_insync_replicas=1))
    assert await _min_insync(kafka, topic) == "1"
    async with kafka.started_admin() as admin:
        [described] = await admin.describe_topics([topic])
    assert len(described["partitions"]) == 3
    assert {len(partition["replicas"]) for partition in described["partitions"]} == {1}


async def test_without_creating_missing_topics_are_named(kafka_bootstrap: str, topic_prefix: str) -> None:
    kafka = KafkaClients(kafka_bootstrap)
    present, small, absent = (f"{topic_prefix}{name}" for name in ("present", "small", "absent"))
    await ensure_topics(kafka, [present], 4)
    await ensure_topics(kafka, [small], 2)
    check_only = TopicLayout(4, create=False)
    await ensure_topics(kafka, [present], check_only)  # all there: nothing to say
    with pytest.raises(TopicsMissing) as refused:
        await ensure_topics(kafka, [present, small, absent], check_only)
    message = str(refused.value)
    assert f"do not exist: {absent}" in message
    assert f"{small} (2)" in message and "SAGA_TOPIC_PARTITIONS=4" in message
    assert present not in message
    assert "SAGA_CREATE_TOPICS" in message
    async with kafka.started_admin() as admin:
        assert absent not in await admin.list_topics()  # checking created nothing


async def test_a_partition_count_other_than_the_topics_is_refused(kafka_bootstrap: str, topic_prefix: str) -> None:
    kafka = KafkaClients(kafka_bootstrap)
    topic = f"{topic_prefix}counted"
    await ensure_topics(kafka, [topic], 4)
    await ensure_topics(kafka, [topic], 4)  # the same count: nothing to say
    with pytest.raises(PartitionsDisagree, match=rf"SAGA_TOPIC_PARTITIONS=8, but {topic} has 4: every process"):
        await ensure_topics(kafka, [topic], 8)


async def test_the_connection_check(kafka_bootstrap: str) -> None:
    await KafkaClients(kafka_bootstrap).check()
    with pytest.raises(KafkaConnectionError, match=r"127\.0\.0\.1:1"):
        await KafkaClients("127.0.0.1:1").check(timeout_s=2)
