"""A faust-streaming agent consumes from the real broker (in-process, web server off, private data folder)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import faust
from aiokafka import AIOKafkaProducer

from saga_orchestrator.infra.kafka_admin import ensure_topics
from saga_orchestrator.infra.kafka_clients import KafkaClients

MESSAGES = 50


async def test_faust_agent_receives_every_message(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    topic_name = f"{topic_prefix}faust-input"
    await ensure_topics(KafkaClients(kafka_bootstrap), [topic_name], 1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for number in range(MESSAGES):
            await producer.send_and_wait(topic_name, str(number).encode())
    finally:
        await producer.stop()

    app = faust.App(
        f"{topic_prefix}faust-app",
        broker=f"kafka://{kafka_bootstrap}",
        web_enabled=False,
        datadir=str(tmp_path),
        store="memory://",
        topic_replication_factor=1,
        topic_partitions=1,
        autodiscover=False,
    )
    received: list[bytes] = []
    all_received = asyncio.Event()

    @app.agent(app.topic(topic_name, value_serializer="raw"))
    async def collect(stream: faust.StreamT[bytes]) -> None:
        async for value in stream:
            received.append(value)
            if len(received) == MESSAGES:
                all_received.set()

    await app.start()
    try:
        await asyncio.wait_for(all_received.wait(), timeout=60)
    finally:
        await app.stop()
    assert received == [str(number).encode() for number in range(MESSAGES)]
