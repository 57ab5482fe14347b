"""A faust-streaming agent consumes from the real broker (in-process, web server off, private data folder)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import faust
from aiokafka import AIOKafkaProducer

from saga_orchestrator.infra.kafka_admin import ensure_topics
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.participants.batching import natural_batches

MESSAGES = 50


async def _produced(kafka_bootstrap: str, topic_name: str, numbers: range = range(MESSAGES)) -> None:
    """``topic_name`` (one partition) with ``numbers`` appended, in order."""
    await ensure_topics(KafkaClients(kafka_bootstrap), [topic_name], 1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for number in numbers:
            await producer.send(topic_name, str(number).encode())
        await producer.flush()
    finally:
        await producer.stop()


def _app(name: str, kafka_bootstrap: str, tmp_path: Path) -> faust.App:
    return faust.App(
        name,
        broker=f"kafka://{kafka_bootstrap}",
        web_enabled=False,
        datadir=str(tmp_path),
        store="memory://",
        topic_replication_factor=1,
        topic_partitions=1,
        autodiscover=False,
    )


async def _run_until(app: faust.App, done: asyncio.Event) -> None:
    await app.start()
    try:
        await asyncio.wait_for(done.wait(), timeout=60)
    finally:
        await app.stop()


EXPECTED = [str(number).encode() for number in range(MESSAGES)]


async def test_faust_agent_receives_every_message(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    topic_name = f"{topic_prefix}faust-input"
    await _produced(kafka_bootstrap, topic_name)
    app = _app(f"{topic_prefix}faust-app", kafka_bootstrap, tmp_path)
    received: list[bytes] = []
    all_received = asyncio.Event()

    @app.agent(app.topic(topic_name, value_serializer="raw"))
    async def collect(stream: faust.StreamT[bytes]) -> None:
        async for value in stream:
            received.append(value)
            if len(received) == MESSAGES:
                all_received.set()

    await _run_until(app, all_received)
    assert received == EXPECTED


async def test_what_arrives_while_a_batch_is_handled_is_the_next_batch(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """participants.batching on a real agent: the events fed while a batch's handler is busy wait in the buffer
    and come as the next batch, whole and in order (group commit)."""
    topic_name = f"{topic_prefix}faust-batches"
    backlog = MESSAGES // 2
    await _produced(kafka_bootstrap, topic_name, range(backlog))
    app = _app(f"{topic_prefix}faust-batches-app", kafka_bootstrap, tmp_path)
    batches: list[list[bytes]] = []
    all_received = asyncio.Event()

    @app.agent(app.topic(topic_name, value_serializer="raw"))
    async def collect(stream: faust.StreamT[bytes]) -> None:
        async for events in natural_batches(stream, 100, 0.025):
            if not batches:  # a slow first transaction: the rest is produced and arrives meanwhile
                await _produced(kafka_bootstrap, topic_name, range(backlog, MESSAGES))
                await asyncio.sleep(0.5)
            batches.append([event.value for event in events])
            for event in events:
                event.ack()
            if sum(map(len, batches)) == MESSAGES:
                all_received.set()

    await _run_until(app, all_received)
    assert [value for batch in batches for value in batch] == EXPECTED
    assert len(batches) == 2, [len(batch) for batch in batches]
    assert batches[1][-(MESSAGES - backlog) :] == EXPECTED[backlog:]
