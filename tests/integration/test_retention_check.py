"""A service refuses to start when it would forget a message's idempotency record before Kafka forgets the
message (real broker): it reads the retention of the topics it consumes and says which setting to change."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from saga_orchestrator.cli.run_cmd import service_environment
from saga_orchestrator.infra.kafka_admin import (
    RetentionTooShort,
    check_retention,
    retention_problem,
    topic_retention_ms,
)
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.infra.settings import Settings

pytestmark = pytest.mark.integration

DAY_MS = 24 * 3_600_000


def test_the_problem_names_the_setting_and_the_value_that_would_do() -> None:
    problem = retention_problem("saga_inbox_retention_hours", 168, {"a": DAY_MS, "b": 30 * DAY_MS})
    assert problem is not None and problem.startswith("SAGA_INBOX_RETENTION_HOURS=168 keeps idempotency records 168 h")
    assert "topic b keeps its records 720 h" in problem and "to at least 720 (or 0 to keep them)" in problem
    assert "forever" in (retention_problem("x", 1, {"a": -1}) or "")
    assert retention_problem("x", 0, {"a": -1}) is None  # kept forever too
    assert retention_problem("x", 720, {"a": 30 * DAY_MS}) is None


async def test_check_reads_the_topic_configuration(kafka_bootstrap: str, topic_prefix: str) -> None:
    topic = f"{topic_prefix}retention-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"retention.ms": str(30 * DAY_MS)})])
    finally:
        await admin.close()
    assert await topic_retention_ms(KafkaClients(kafka_bootstrap), [topic, f"{topic}-missing"]) == {topic: 30 * DAY_MS}
    with pytest.raises(RetentionTooShort, match="SAGA_PARTICIPANT_RETENTION_HOURS to at least 720"):
        await check_retention(KafkaClients(kafka_bootstrap), [topic], "saga_participant_retention_hours", 168)
    await check_retention(KafkaClients(kafka_bootstrap), [topic], "saga_participant_retention_hours", 720)
    await check_retention(KafkaClients(kafka_bootstrap), [topic], "saga_participant_retention_hours", 0)


async def test_a_participant_worker_refuses_to_start_and_says_what_to_change(settings: Settings) -> None:
    prefix = f"r{uuid.uuid4().hex[:8]}."
    env = {**service_environment(settings.model_copy(update={"saga_topic_prefix": prefix})),
           "SAGA_PARTICIPANT_RETENTION_HOURS": "1"}
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "saga_orchestrator.cli", "run", "participant", "flight"],
        env=env, capture_output=True, text=True, timeout=120)
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, said[-2000:]
    assert f"topic {prefix}flight.commands keeps its records" in said
    assert "Set SAGA_PARTICIPANT_RETENTION_HOURS to at least" in said
