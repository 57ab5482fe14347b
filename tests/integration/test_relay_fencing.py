"""A relay whose host is cut off from Postgres without its connections being closed (a network partition, a
NAT that forgot the flow): a standby takes over within 30 s and the cut-off relay, which can still reach Kafka,
publishes nothing after that. Real Postgres and Kafka; the cut is a TCP proxy that stops forwarding and keeps
both ends open, so neither Postgres nor the relay sees the connection close."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.outbox.publishing import default_producer_factory
from saga_orchestrator.outbox.relay import OutboxRelay
from saga_orchestrator.outbox.table import OutboxMessage, write_outbox
from tests.integration.conftest import fresh_outbox, fresh_topic

pytestmark = pytest.mark.integration


class Blackhole:
    """Forwards TCP to ``upstream`` until ``cut``; then drops every byte both ways and closes nothing."""

    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self.cut = asyncio.Event()
        self._never = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        if self.cut.is_set():
            await self._never.wait()  # a new connection after the cut: accepted, never answered
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        self._writers.append(up_writer)
        for pump in (self._pump(reader, up_writer), self._pump(up_reader, writer)):
            task = asyncio.create_task(pump)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            if self.cut.is_set():
                await self._never.wait()
            writer.write(data)
            await writer.drain()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()


class Recorded:
    """A real producer that notes when it is handed each record batch."""

    def __init__(self, producer: Any, sent_at: list[float]) -> None:
        self._producer = producer
        self._sent_at = sent_at

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    async def send_batch(self, *args: Any, **kwargs: Any) -> Any:
        self._sent_at.append(time.monotonic())
        return await self._producer.send_batch(*args, **kwargs)


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, 4)
    yield pool
    await pool.close()


async def test_a_cut_off_relay_is_replaced_and_publishes_nothing_after(
        pool: asyncpg.Pool, database_url: str, kafka_bootstrap: str, topic_prefix: str) -> None:
    table = await fresh_outbox(pool, "fence")
    topic = await fresh_topic(kafka_bootstrap, f"{topic_prefix}fence", 2)

    url = urlsplit(database_url)
    proxy = Blackhole(url.hostname or "127.0.0.1", url.port or 5432)
    proxy_port = await proxy.start()
    through_proxy = urlunsplit(url._replace(netloc=f"{url.username}@127.0.0.1:{proxy_port}"))
    zombie_pool = await create_pool(through_proxy, 2)
    kafka = KafkaClients(kafka_bootstrap)
    zombie_sends: list[float] = []
    standby_sends: list[float] = []

    def recording(sent_at: list[float]) -> Any:
        make = default_producer_factory(kafka)
        return lambda: Recorded(make(), sent_at)

    zombie = OutboxRelay(zombie_pool, table, producer_factory=recording(zombie_sends))
    standby = OutboxRelay(pool, table, producer_factory=recording(standby_sends))
    stop = asyncio.Event()
    written: list[str] = []

    async def writer() -> None:  # a row every 20 ms, as a busy service writes them
        n = 0
        while not stop.is_set():
            message_id = f"row-{n}"
            async with pool.acquire() as conn, conn.transaction():
                await write_outbox(conn, table, [OutboxMessage(topic, f"k{n % 7}", b"v", {}, message_id)])
            written.append(message_id)
            n += 1
            await asyncio.sleep(0.02)

    zombie_task = asyncio.create_task(zombie.run(stop))
    await _until(lambda: zombie.is_active, 10)
    standby_task = asyncio.create_task(standby.run(stop))
    writing = asyncio.create_task(writer())
    try:
        await _until(lambda: len(zombie_sends) >= 20, 10)
        assert not standby_sends  # the standby stands by while the active relay renews its lease
        proxy.cut.set()
        cut_at = time.monotonic()
        await _until(lambda: bool(standby_sends), 30)
        took_over_s = standby_sends[0] - cut_at
        await asyncio.sleep(8)  # the zombie keeps trying (its statements time out, it reconnects)
    finally:
        stop.set()
        writing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writing
        await asyncio.wait_for(standby_task, 20)
        await proxy.close()  # the zombie's statements now fail at once and it stops
        await asyncio.wait_for(zombie_task, 30)
        await zombie_pool.close()
    assert took_over_s < 30
    late = [at for at in zombie_sends if at >= standby_sends[0]]
    assert late == [], f"the cut-off relay handed {len(late)} batches to Kafka after the standby took over"
    assert standby.published_total > 0

    async with pool.acquire() as conn:
        left = {row["message_id"] for row in await conn.fetch(f"SELECT message_id FROM {table}")}
    published = await _message_ids(kafka_bootstrap, topic, len(written) - len(left))
    assert set(written) - left <= published  # every row that left the outbox is on Kafka
    print(f"standby took over {took_over_s:.1f} s after the cut; the zombie handed {len(zombie_sends)} batches"
          f" to Kafka, all before; {len(written)} rows written, {len(published)} distinct on Kafka")


async def _message_ids(bootstrap: str, topic: str, expected: int) -> set[str]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + 20
        while len(seen) < expected and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for record in records:
                    seen.add(dict(record.headers)["message_id"].decode())
    finally:
        await consumer.stop()
    return seen


async def _until(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)
