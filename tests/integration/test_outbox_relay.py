"""The outbox relay on a real Postgres and a real Kafka broker."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.partitioner import DefaultPartitioner

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.outbox.lease import shard_lock_key
from saga_orchestrator.outbox.parked import requeue_parked
from saga_orchestrator.outbox.relay import OutboxRelay
from saga_orchestrator.outbox.table import OutboxMessage, write_outbox
from tests.e2e.harness import saga_cli
from tests.integration.conftest import fresh_outbox, fresh_topic

pytestmark = pytest.mark.integration

Received = list[tuple[str, str, dict[str, bytes], bytes]]  # (key, message_id, headers, value)


@pytest.fixture(scope="module")
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, 8)
    yield pool
    await pool.close()


@pytest.fixture
async def table(pool: asyncpg.Pool) -> str:
    """A fresh outbox table per test, so relays of different tests never share a lease or rows."""
    return await fresh_outbox(pool, "relay")


@pytest.fixture
async def topic(kafka_bootstrap: str, topic_prefix: str) -> str:
    return await fresh_topic(kafka_bootstrap, f"{topic_prefix}relay-test", 3)


def relay(pool: asyncpg.Pool, table: str, bootstrap: str, **options: Any) -> OutboxRelay:
    return OutboxRelay(pool, table, KafkaClients(bootstrap), **{"standby_retry_ms": 50, **options})


def messages(topic: str, keys: list[str], count: int, start: int = 0, **fields: Any) -> list[OutboxMessage]:
    """``count`` messages per key, interleaved across keys; message ids say key and position."""
    return [
        OutboxMessage(topic, key, f"{key}#{n}".encode(), {"saga_id": key}, f"{key}:event:{n}", **fields)
        for n in range(start, start + count)
        for key in keys
    ]


async def write(pool: asyncpg.Pool, table: str, batch: list[OutboxMessage]) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await write_outbox(conn, table, batch)


async def drain(relay: OutboxRelay) -> int:
    total = 0
    while published := await relay.publish_once():
        total += published
    return total


async def consume(bootstrap: str, topic: str, expected: int, timeout_s: float = 20) -> Received:
    """Read the topic from the start until ``expected`` records arrived (or the timeout), then ~0.5 s more
    to catch unexpected extras."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    received: Received = []
    try:
        deadline = time.monotonic() + timeout_s
        extra_until: float | None = None
        while time.monotonic() < (extra_until or deadline):
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    headers = {name: value for name, value in record.headers}
                    received.append(
                        (record.key.decode(), headers["message_id"].decode(), headers, record.value)
                    )
            if len(received) >= expected and extra_until is None:
                extra_until = time.monotonic() + 0.5
    finally:
        await consumer.stop()
    return received


def ids_by_key(received: Received) -> dict[str, list[str]]:
    by_key: dict[str, list[str]] = defaultdict(list)
    for key, message_id, _, _ in received:
        by_key[key].append(message_id)
    return dict(by_key)


def active_lock_key(relay: OutboxRelay) -> int:
    """The advisory-lock key of the relay's one shard as pg_locks shows it (unsigned)."""
    return shard_lock_key(relay.table, 0) & 0xFFFF_FFFF_FFFF_FFFF


async def advisory_locks_held(pool: asyncpg.Pool) -> set[int]:
    """Every session-level advisory lock on a bigint key held now in this database, by any backend."""
    rows = await pool.fetch("SELECT classid::bigint AS high, objid::bigint AS low FROM pg_locks"
                            " WHERE locktype = 'advisory' AND objsubid = 1 AND granted"
                            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
    return {row["high"] << 32 | row["low"] for row in rows}


async def rows_left(pool: asyncpg.Pool, table: str) -> int:
    count: int = await pool.fetchval(f"SELECT count(*) FROM {table}")
    return count


async def test_publishes_in_id_order_per_key_with_headers_and_deletes(
    pool: asyncpg.Pool, table: str, topic: str, kafka_bootstrap: str
) -> None:
    keys = [f"saga-{n}" for n in range(5)]
    for start in range(0, 60, 20):  # several writing transactions
        await write(pool, table, messages(topic, keys, 20, start))
    publisher = relay(pool, table, kafka_bootstrap, batch_size=70)
    try:
        assert await drain(publisher) == 300
    finally:
        await publisher.close()
    assert await rows_left(pool, table) == 0
    received = await consume(kafka_bootstrap, topic, 300)
    assert len(received) == 300
    assert ids_by_key(received) == {key: [f"{key}:event:{n}" for n in range(60)] for key in keys}
    key, message_id, headers, value = received[0]
    assert headers["saga_id"] == key.encode() and headers["message_id"] == message_id.encode()
    assert value == f"{key}#{message_id.rsplit(':', 1)[1]}".encode()


async def test_each_key_lands_on_the_partition_of_the_default_partitioner(
    pool: asyncpg.Pool, table: str, topic: str, kafka_bootstrap: str
) -> None:
    keys = [f"saga-{n}" for n in range(40)]
    await write(pool, table, messages(topic, keys, 2))
    publisher = relay(pool, table, kafka_bootstrap)
    try:
        assert await drain(publisher) == 80
    finally:
        await publisher.close()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                                group_id=None)
    await consumer.start()
    placed: dict[str, set[int]] = defaultdict(set)
    try:
        while sum(len(parts) for parts in placed.values()) < 40 or len(placed) < 40:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                for record in records:
                    placed[record.key.decode()].add(record.partition)
    finally:
        await consumer.stop()
    # Where any Kafka client's send() would put the key (murmur2 over the topic's 3 partitions).
    expected = {key: {DefaultPartitioner()(key.encode(), [0, 1, 2], [0, 1, 2])} for key in keys}
    assert placed == expected
    assert len({partition for (partition,) in placed.values()}) == 3


async def test_rows_that_overflow_a_record_batch_keep_their_order(
    pool: asyncpg.Pool, table: str, topic: str, kafka_bootstrap: str
) -> None:
    def small_batches() -> AIOKafkaProducer:  # about four of these rows fill a batch
        return AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True,
                                max_batch_size=1024)

    await write(pool, table, [OutboxMessage(topic, "one-key", bytes(200) + str(n).encode(), {"saga_id": "one-key"},
                                            f"one-key:event:{n}") for n in range(30)])
    publisher = OutboxRelay(pool, table, producer_factory=small_batches)
    try:
        assert await drain(publisher) == 30
    finally:
        await publisher.close()
    received = await consume(kafka_bootstrap, topic, 30)
    assert [message_id for _, message_id, _, _ in received] == [f"one-key:event:{n}" for n in range(30)]
    assert [value[200:] for _, _, _, value in received] == [str(n).encode() for n in range(30)]


async def test_a_row_is_not_published_before_its_available_at(
    pool: asyncpg.Pool, table: str, topic: str, kafka_bootstrap: str
) -> None:
    due_ms = time.time_ns() // 1_000_000 + 1500
    await write(pool, table, messages(topic, ["late"], 1, available_at=due_ms) + messages(topic, ["now"], 1))
    publisher = relay(pool, table, kafka_bootstrap)
    try:
        assert await drain(publisher) == 1
        assert await rows_left(pool, table) == 1
        assert [m for _, m, _, _ in await consume(kafka_bootstrap, topic, 1)] == ["now:event:0"]
        await asyncio.sleep(max(0.0, due_ms / 1000 - time.time()) + 0.1)
        assert await drain(publisher) == 1
    finally:
        await publisher.close()
    received = await consume(kafka_bootstrap, topic, 2)
    assert sorted(m for _, m, _, _ in received) == ["late:event:0", "now:event:0"]


async def test_a_restarted_relay_publishes_what_was_left(
    pool: asyncpg.Pool, table: str, topic: str, kafka_bootstrap: str
) -> None:
    keys = ["a", "b"]
    await write(pool, table, messages(topic, keys, 30))
    first = relay(pool, table, kafka_bootstrap, batch_size=25)
    assert await first.publish_once() == 25
    await first.close()  # stopped mid-backlog
    await write(pool, table, messages(topic, keys, 10, start=30))
    second = relay(pool, table, kafka_bootstrap, batch_size=25)
    try:
        assert await drain(second) == 55
    finally:
        await second.close()
    received = await consume(kafka_bootstrap, topic, 80)
    assert ids_by_key(received) == {key: [f"{key}:event:{n}" for n in range(40)] for key in keys}


async def test_a_crash_between_publish_and_delete_republishes_with_the_same_message_id(
    pool: asyncpg.Pool, table: str, topic: str, kafka_bootstrap: str
) -> None:
    await write(pool, table, messages(topic, ["k"], 3))
    crashing = relay(pool, table, kafka_bootstrap)
    dying = "SELECT pg_terminate_backend(pg_backend_pid())"  # dies right after the acks
    crashing._delete_sql = crashing._delete_asking_sql = dying
    with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, ConnectionError)):
        await crashing.publish_once()
    await crashing.close()
    assert await rows_left(pool, table) == 3
    survivor = relay(pool, table, kafka_bootstrap)
    try:
        assert await drain(survivor) == 3
    finally:
        await survivor.close()
    received = await consume(kafka_bootstrap, topic, 6)
    assert [m for _, m, _, _ in received] == ["k:event:0", "k:event:1", "k:event:2"] * 2


async def test_only_one_relay_per_table_publishes(
    pool: asyncpg.Pool, table: str, topic: str, kafka_bootstrap: str
) -> None:
    active = relay(pool, table, kafka_bootstrap)
    standby = relay(pool, table, kafka_bootstrap)
    try:
        await write(pool, table, messages(topic, ["k"], 5))
        assert await active.publish_once() == 5
        await write(pool, table, messages(topic, ["k"], 5, start=5))
        assert await standby.publish_once() == 0
        assert active.is_active and not standby.is_active
        await active.close()  # the active relay goes away: the standby takes over
        assert active_lock_key(active) not in await advisory_locks_held(pool)  # the lock left with it
        assert await standby.publish_once() == 5
    finally:
        await active.close()
        await standby.close()
    received = await consume(kafka_bootstrap, topic, 10)
    assert [m for _, m, _, _ in received] == [f"k:event:{n}" for n in range(10)]


async def test_two_running_relays_publish_everything_once(
    pool: asyncpg.Pool, table: str, topic: str, kafka_bootstrap: str
) -> None:
    relays = [relay(pool, table, kafka_bootstrap, batch_size=50) for _ in range(2)]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(r.run(stop)) for r in relays]
    try:
        for start in range(0, 200, 20):
            await write(pool, table, messages(topic, ["x", "y"], 20, start))
            await asyncio.sleep(0.01)
        await _wait_until_empty(pool, table)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert sorted(r.published_total for r in relays) == [0, 400]
    received = await consume(kafka_bootstrap, topic, 400)
    assert ids_by_key(received) == {key: [f"{key}:event:{n}" for n in range(200)] for key in ("x", "y")}


async def test_run_keeps_going_through_a_kafka_outage_and_a_lost_connection(
    pool: asyncpg.Pool, table: str, topic: str, kafka_bootstrap: str
) -> None:
    attempts = 0

    def producer_factory() -> AIOKafkaProducer:
        nonlocal attempts
        attempts += 1
        # The first two producers point at a closed port: the broker is "down".
        servers = "127.0.0.1:1" if attempts <= 2 else kafka_bootstrap
        return AIOKafkaProducer(bootstrap_servers=servers, acks="all", enable_idempotence=True)

    runner = OutboxRelay(pool, table, producer_factory=producer_factory, max_backoff_ms=200)
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        await write(pool, table, messages(topic, ["k"], 3))
        await _wait_until_empty(pool, table)
        assert attempts == 3
        # Postgres drops the relay's connection (as in a restart): the relay reconnects and carries on. Only
        # this test's database: other test modules running beside it hold advisory locks of their own.
        killed = await pool.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks"
            " WHERE locktype = 'advisory' AND pid <> pg_backend_pid()"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        assert killed >= 1
        await write(pool, table, messages(topic, ["k"], 3, start=3))
        await _wait_until_empty(pool, table)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    received = await consume(kafka_bootstrap, topic, 6)
    assert [m for _, m, _, _ in received] == [f"k:event:{n}" for n in range(6)]


async def _wait_until_empty(pool: asyncpg.Pool, table: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while await rows_left(pool, table):
        assert time.monotonic() < deadline, "relay did not publish in time"
        await asyncio.sleep(0.05)


async def test_a_row_the_broker_refuses_is_parked_and_only_its_key_waits(
        pool: asyncpg.Pool, table: str, kafka_bootstrap: str, topic_prefix: str, database_url: str) -> None:
    small = f"{topic_prefix}relay-small-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(small, num_partitions=2, replication_factor=1,
                                            topic_configs={"max.message.bytes": "4096"})])
    finally:
        await admin.close()
    rows = messages(small, ["a", "b", "c"], 3)
    too_big = OutboxMessage(small, "b", b"x" * 20_000, {"saga_id": "b"}, "b:event:big")
    await write(pool, table, [*rows[:4], too_big, *rows[4:]])  # b's big row after its first one
    publisher = relay(pool, table, kafka_bootstrap)
    try:
        assert await drain(publisher) == 7  # all of a and c, b's first row; b's last two wait
        received = ids_by_key(await consume(kafka_bootstrap, small, 7))
    finally:
        await publisher.close()
    assert received == {"a": ["a:event:0", "a:event:1", "a:event:2"], "b": ["b:event:0"],
                        "c": ["c:event:0", "c:event:1", "c:event:2"]}
    parked = await pool.fetch(f"SELECT id, message_key, message_id, reason FROM {publisher.parked_table}")
    assert [(row["message_key"], row["message_id"]) for row in parked] == [("b", "b:event:big")]
    assert "MessageSizeTooLarge" in parked[0]["reason"] or "RecordTooLarge" in parked[0]["reason"]
    waiting = await pool.fetch(f"SELECT message_id FROM {table} ORDER BY id")
    assert [row["message_id"] for row in waiting] == ["b:event:1", "b:event:2"]  # held, in order
    assert publisher.parked_total == 1

    # Requeued before the cause is fixed, it goes first again and is parked again: b's rows still wait.
    assert await requeue_parked(pool, table, [parked[0]["id"]]) == 1
    publisher = relay(pool, table, kafka_bootstrap)
    try:
        assert await drain(publisher) == 0 and publisher.parked_total == 1
    finally:
        await publisher.close()
    # The operator lists it and discards it with the CLI: b goes on.
    schema = table.split(".")[0]
    current = Settings(database_url=database_url)
    listed = await saga_cli(current, "outbox", "list", "--schema", schema)
    assert listed.returncode == 0 and "b:event:big" in listed.stdout, listed.stderr
    discarded = await saga_cli(current, "outbox", "discard", str(parked[0]["id"]), "--schema", schema)
    assert discarded.returncode == 0 and "discarded 1 row(s)" in discarded.stdout, discarded.stderr
    again = await saga_cli(current, "outbox", "discard", str(parked[0]["id"]), "--schema", schema)
    assert again.returncode == 1 and "not parked" in " ".join(again.stdout.split() + again.stderr.split())
    publisher = relay(pool, table, kafka_bootstrap)
    try:
        assert await drain(publisher) == 2
        received = ids_by_key(await consume(kafka_bootstrap, small, 9))
    finally:
        await publisher.close()
    assert received["b"] == ["b:event:0", "b:event:1", "b:event:2"]


async def test_a_failing_look_between_polls_does_not_stop_the_relay(
        pool: asyncpg.Pool, table: str, topic: str, kafka_bootstrap: str) -> None:
    # Between polls an idle relay asks when held-back rows come due; a Postgres restart can fail that query
    # (here every time). The relay must carry on, as it does when a poll fails.
    runner = relay(pool, table, kafka_bootstrap, max_poll_ms=200)
    runner._held_back_sql = "SELECT 1 / 0"
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        await write(pool, table, messages(topic, ["k"], 2))
        await _wait_until_empty(pool, table)
        await asyncio.sleep(0.5)  # idle polls, each followed by the failing look
        assert not task.done()
        await write(pool, table, messages(topic, ["k"], 2, start=2))
        await _wait_until_empty(pool, table)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert [m for _, m, _, _ in await consume(kafka_bootstrap, topic, 4)] == [f"k:event:{n}" for n in range(4)]


async def test_a_woken_relay_publishes_a_held_back_row_when_it_is_due_not_at_its_next_poll(
        pool: asyncpg.Pool, table: str, topic: str, kafka_bootstrap: str) -> None:
    # An idle relay's polls grow apart (here past 3 s); a writer's wake makes it publish the due row, and the
    # delete of that pass also tells when the held-back row is due, so the relay naps only until then.
    runner = relay(pool, table, kafka_bootstrap, max_poll_ms=20_000)
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        await asyncio.sleep(4.0)  # empty polls: 0.05, 0.1, ... 1.6 s apart, now a 3.2 s nap
        written = time.monotonic()
        due_ms = time.time_ns() // 1_000_000 + 1000
        await write(pool, table, messages(topic, ["late"], 1, available_at=due_ms) + messages(topic, ["now"], 1))
        runner.wake()
        await _wait_until_empty(pool, table)
        took_s = time.monotonic() - written
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert 1.0 <= took_s < 2.5, f"held-back row published {took_s:.2f} s after it was written, due after 1 s"
    assert sorted(m for _, m, _, _ in await consume(kafka_bootstrap, topic, 2)) == ["late:event:0", "now:event:0"]
