"""The orchestrator's outbox reaches Kafka both ways it can be deployed: relayed inside the orchestrator
(``saga run orchestrator --with-relay``, what ``saga run all`` runs: woken by each commit) or by a relay
service of its own (``saga run relay``: polling)."""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from saga_orchestrator.client.event_feed import assign_from_beginning
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.bootstrap import run_orchestrator, run_relay
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.topics import Topics

pytestmark = pytest.mark.integration


async def first_command_for(bootstrap: str, topic: str, saga_id: str, seconds: float) -> bool:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await consumer.start()
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                await assign_from_beginning(consumer, topic)
                break
            except RuntimeError:  # the orchestrator creates its topics as it starts
                await asyncio.sleep(0.2)
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=200)
            if any(record.key == saga_id.encode() for records in batches.values() for record in records):
                return True
        return False
    finally:
        await consumer.stop()


async def outbox_drained(dsn: str, saga_id: str, seconds: float) -> bool:
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if await conn.fetchval("SELECT count(*) FROM saga.outbox WHERE message_key = $1", saga_id) == 0:
                return True
            await asyncio.sleep(0.1)
        return False
    finally:
        await conn.close()


@pytest.mark.parametrize("in_process", [True, False], ids=["in-process", "relay-service"])
async def test_the_relay_publishes_the_commands(settings: Settings, in_process: bool) -> None:
    topics = Topics(settings.saga_topic_prefix)
    saga_id = f"relay-{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()
    services = [run_orchestrator(settings, stop, with_relay=in_process)]
    if not in_process:
        services.append(run_relay(settings, stop))
    running = asyncio.ensure_future(asyncio.gather(*services))
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_servers(), acks="all")
    await producer.start()
    try:
        while True:  # the orchestrator creates saga.start as it starts
            try:
                await producer.send_and_wait(topics.start, wire.encode_start(SCENARIOS["happy"].start(saga_id)),
                                             key=saga_id.encode(), headers=[("message_id", saga_id.encode())])
                break
            except Exception:
                if running.done():
                    raise
                await asyncio.sleep(0.2)
        # The command reaches Kafka only through the one relay of this deployment.
        assert await first_command_for(settings.kafka_servers(), topics.commands("flight"), saga_id, 60)
        assert await outbox_drained(settings.dsn(), saga_id, 15)  # published rows are deleted after the acks
    finally:
        await producer.stop()
        stop.set()
        await asyncio.wait_for(running, 30)
