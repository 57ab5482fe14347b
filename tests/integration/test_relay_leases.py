"""Outbox shard leases and the relays that hold them, on a real Postgres (and Kafka where rows are published)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.outbox.lease import ShardLeases, leases_table
from saga_orchestrator.outbox.relay import OutboxRelay
from saga_orchestrator.outbox.table import OutboxMessage, insert_params, insert_sql
from tests.integration.conftest import fresh_outbox, fresh_topic

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, 10)
    yield pool
    await pool.close()


@pytest.fixture
async def table(pool: asyncpg.Pool) -> str:
    return await fresh_outbox(pool, "lease")


@pytest.fixture
async def topic(kafka_bootstrap: str, topic_prefix: str) -> str:
    return await fresh_topic(kafka_bootstrap, f"{topic_prefix}lease-test", 4)


def leases(table: str, **options: Any) -> ShardLeases:
    return ShardLeases(table, **{"ttl_s": 1.0, "trust_s": 0.6, "renew_every_s": 0.2, "retry_every_s": 0.0,
                                 **options})


async def write(pool: asyncpg.Pool, table: str, topic: str, by_shard: dict[int, int]) -> None:
    """``by_shard[s]`` rows in shard ``s``, keyed ``s-<n>``."""
    messages = [OutboxMessage(topic, f"{shard}-{n}", b"v", {"saga_id": f"{shard}-{n}"}, f"{shard}:{n}:{uuid.uuid4()}")
                for shard, count in by_shard.items() for n in range(count)]
    shards = [int(m.key.split("-")[0]) for m in messages]
    await pool.execute(insert_sql(table, 1, shard_parameter=7), *insert_params(messages), shards)


async def test_a_shard_has_one_holder_and_its_epoch_rises_at_each_change(pool: asyncpg.Pool, table: str) -> None:
    async with pool.acquire() as first_conn, pool.acquire() as second_conn:
        first, second = leases(table), leases(table)
        await first.refresh(first_conn, {0, 1}, 2)
        await second.refresh(second_conn, {0, 1, 2}, 2)
        assert first.epochs == {0: 1, 1: 1} and second.epochs == {2: 1}
        await first.refresh(first_conn, {0}, 2)  # shard 1 given back: free at once, no expiry to wait for
        await second.refresh(second_conn, {0, 1, 2}, 2)
        assert first.epochs == {0: 1} and second.epochs == {1: 2, 2: 1}
        rows = await first_conn.fetch(f"SELECT shard, holder, epoch FROM {leases_table(table)} ORDER BY shard")
        assert [(r["shard"], r["holder"], r["epoch"]) for r in rows] == [
            (0, first.holder, 1), (1, second.holder, 2), (2, second.holder, 1)]
        await first.give_back(first_conn, {0}, 2)
        await second.give_back(second_conn, {1, 2}, 2)


async def test_an_expired_lease_is_taken_over_and_the_old_holder_is_fenced(
        pool: asyncpg.Pool, table: str, topic: str) -> None:
    await write(pool, table, topic, {0: 3})
    relay = OutboxRelay(pool, table, producer_factory=lambda: None)
    select = relay._select_sql  # the fenced read every pass makes
    async with pool.acquire() as zombie_conn, pool.acquire() as standby_conn:
        zombie, standby = leases(table), leases(table)
        await zombie.refresh(zombie_conn, {0}, 2)
        assert zombie.trusted() and len(await zombie_conn.fetch(select, 10, zombie.holder, [0], [1])) == 3
        await standby.refresh(standby_conn, {0}, 2)
        assert standby.epochs == {}  # the zombie's session is alive and its lease not expired
        await asyncio.sleep(0.7)
        assert not zombie.trusted()  # its trust ends before its lease does...
        await standby.refresh(standby_conn, {0}, 2)
        assert standby.epochs == {}
        await asyncio.sleep(0.5)  # ...which expires while its session (and advisory lock) live on
        await standby.refresh(standby_conn, {0}, 2)
        assert standby.epochs == {0: 2}
        # The zombie wakes up and reads with the epoch it had: nothing.
        assert await zombie_conn.fetch(select, 10, zombie.holder, [0], [1]) == []
        await zombie.refresh(zombie_conn, {0}, 2)  # and a renewal tells it
        assert zombie.epochs == {}
        assert len(await standby_conn.fetch(select, 10, standby.holder, [0], [2])) == 3


async def test_a_holder_whose_session_ends_is_replaced_without_waiting_for_the_expiry(
        pool: asyncpg.Pool, table: str) -> None:
    holder = leases(table, ttl_s=60.0, trust_s=30.0)
    conn = await pool.acquire()
    await holder.refresh(conn, {0, 1}, 2)
    standby = leases(table, ttl_s=60.0, trust_s=30.0)
    async with pool.acquire() as standby_conn:
        await standby.refresh(standby_conn, {0, 1}, 2)
        assert standby.epochs == {}
        started = time.monotonic()
        await pool.execute("SELECT pg_terminate_backend($1)", conn.get_server_pid())  # as when its process dies
        await pool.release(conn)
        while not standby.epochs:
            await asyncio.sleep(0.05)
            await standby.refresh(standby_conn, {0, 1}, 2)
        assert standby.epochs == {0: 2, 1: 2}
        assert time.monotonic() - started < 5  # far below the 60 s lease


async def test_two_relays_publish_their_own_shards_and_hand_one_over(
        pool: asyncpg.Pool, table: str, topic: str, kafka_bootstrap: str) -> None:
    wanted = {"a": {0, 1}, "b": {2, 3}}
    kafka = KafkaClients(kafka_bootstrap)
    def wanted_by(name: str) -> Callable[[], set[int]]:
        return lambda: wanted[name]

    relays = {name: OutboxRelay(pool, table, kafka, shards=wanted_by(name), standby_retry_ms=50) for name in wanted}
    stop = asyncio.Event()
    tasks = [asyncio.create_task(r.run(stop)) for r in relays.values()]
    try:
        await write(pool, table, topic, {0: 10, 1: 10, 2: 10, 3: 10})
        await _until(lambda: sum(r.published_total for r in relays.values()) == 40)
        assert relays["a"].published_total == 20 and relays["b"].published_total == 20
        assert relays["a"].shards == [0, 1] and relays["b"].shards == [2, 3]
        wanted["a"] = {0}  # a rebalance: shard 1 moves to b
        wanted["b"] = {1, 2, 3}
        await _until(lambda: relays["b"].shards == [1, 2, 3])
        await write(pool, table, topic, {1: 5})
        await _until(lambda: relays["b"].published_total == 25)
        assert relays["a"].published_total == 20
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 15)
    assert await pool.fetchval(f"SELECT count(*) FROM {table}") == 0


async def _until(condition: Any, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)
