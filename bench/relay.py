"""Outbox relay benchmark: backlog throughput, commit→consumer latency, and the cost of NOTIFY.

    python -m bench.relay [--rows 50000] [--batch-size 500] [--dsn ...] [--bootstrap ...]

1. backlog: insert ``--rows`` outbox rows, start a relay, time until every row is published and deleted.
2. latency: one-row transactions every ~20 ms while the relay runs; a consumer measures commit→receive.
3. notify cost: concurrent one-row writer transactions, with and without ``pg_notify`` in each; NOTIFY
   takes a database-wide lock at commit, which is why the relay polls instead of listening.
Each run uses its own schema and topic and drops the schema at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import time
import uuid

import asyncpg
from aiokafka.admin import NewTopic

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.infra.logging import configure_logging
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.outbox.relay import OutboxRelay
from saga_orchestrator.outbox.table import OutboxMessage, outbox_table_sql, write_outbox

VALUE = bytes(200)  # about the size of an encoded step command


def _messages(topic: str, first: int, count: int, sagas: int) -> list[OutboxMessage]:
    return [
        OutboxMessage(topic, f"saga-{n % sagas}", VALUE, {"saga_id": f"saga-{n % sagas}"}, f"bench:{n}")
        for n in range(first, first + count)
    ]


async def _create_topic(kafka: KafkaClients, name: str, partitions: int) -> None:
    admin = kafka.admin()
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()
    await asyncio.sleep(1)  # let partition leaders settle before timing anything


async def _wait_empty(pool: asyncpg.Pool, table: str) -> None:
    while True:
        if not await pool.fetchval(f"SELECT EXISTS (SELECT 1 FROM {table})"):
            return
        await asyncio.sleep(0.005)


async def bench_backlog(pool: asyncpg.Pool, table: str, topic: str, args: argparse.Namespace) -> None:
    started = time.perf_counter()
    chunk = 2000
    for first in range(0, args.rows, chunk):
        async with pool.acquire() as conn, conn.transaction():
            await write_outbox(conn, table, _messages(topic, first, min(chunk, args.rows - first), 1000))
    insert_s = time.perf_counter() - started
    print(
        f"insert   : {args.rows} rows in {insert_s:.2f} s = {args.rows / insert_s:,.0f} rows/s (write_outbox)"
    )

    relay = OutboxRelay(pool, table, KafkaClients(args.bootstrap), batch_size=args.batch_size)
    stop = asyncio.Event()
    await relay.publish_once()  # connect producer and take the lock outside the timed part
    started = time.perf_counter()
    task = asyncio.create_task(relay.run(stop))
    await _wait_empty(pool, table)
    publish_s = time.perf_counter() - started
    stop.set()
    await task
    print(
        f"backlog  : {args.rows} rows published+deleted in {publish_s:.2f} s = "
        f"{args.rows / publish_s:,.0f} rows/s (batch_size={args.batch_size})"
    )


async def bench_latency(pool: asyncpg.Pool, table: str, topic: str, args: argparse.Namespace) -> None:
    consumer = KafkaClients(args.bootstrap).consumer(topic, auto_offset_reset="latest")
    await consumer.start()
    await consumer.seek_to_end()
    relay = OutboxRelay(pool, table, KafkaClients(args.bootstrap))
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    latencies_ms: list[float] = []

    async def receive() -> None:
        while len(latencies_ms) < args.samples:
            batches = await consumer.getmany(timeout_ms=100)
            now = time.time_ns()
            for records in batches.values():
                latencies_ms.extend([(now - int(r.value)) / 1e6 for r in records])

    receiver = asyncio.create_task(receive())
    for n in range(args.samples):
        await asyncio.sleep(random.uniform(0.01, 0.03))  # random phase against the poll interval
        async with pool.acquire() as conn, conn.transaction():
            message = _messages(topic, n, 1, 1000)[0]
            stamped = OutboxMessage(
                message.topic, message.key, str(time.time_ns()).encode(), {}, message.message_id
            )
            await write_outbox(conn, table, [stamped])
    await asyncio.wait_for(receiver, 30)
    stop.set()
    await task
    await consumer.stop()
    q = statistics.quantiles(latencies_ms, n=100)
    print(
        f"latency  : commit→consumer over {len(latencies_ms)} single-row commits (idle relay): "
        f"p50 {q[49]:.1f} ms, p90 {q[89]:.1f} ms, p99 {q[98]:.1f} ms, max {max(latencies_ms):.1f} ms"
    )


async def bench_notify_cost(pool: asyncpg.Pool, table: str, topic: str, args: argparse.Namespace) -> None:
    per_writer = args.notify_txns // args.writers

    async def writer(index: int, notify: bool) -> None:
        async with pool.acquire() as conn:
            for n in range(per_writer):
                async with conn.transaction():
                    await write_outbox(conn, table, _messages(topic, index * per_writer + n, 1, 1000))
                    if notify:
                        await conn.execute("SELECT pg_notify('outbox_bench', '')")

    results: dict[bool, float] = {}
    for notify in (False, True, False, True):  # interleaved, to spread any warm-up effect
        started = time.perf_counter()
        await asyncio.gather(*(writer(i, notify) for i in range(args.writers)))
        rate = per_writer * args.writers / (time.perf_counter() - started)
        results[notify] = max(results.get(notify, 0.0), rate)
        await pool.execute(f"TRUNCATE {table}")
    print(
        f"notify   : {args.writers} concurrent writers, 1-row txns: "
        f"without NOTIFY {results[False]:,.0f} tx/s, "
        f"with NOTIFY {results[True]:,.0f} tx/s ({results[True] / results[False] - 1:+.0%})"
    )


async def main(args: argparse.Namespace) -> None:
    topic = f"bench-relay-{uuid.uuid4().hex[:8]}"
    await _create_topic(KafkaClients(args.bootstrap), topic, args.partitions)
    pool = await create_pool(args.dsn, args.writers + 4)
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    table = f"{schema}.outbox"
    try:
        await pool.execute(outbox_table_sql(schema))
        if "backlog" in args.only:
            await bench_backlog(pool, table, topic, args)
        if "latency" in args.only:
            await bench_latency(pool, table, topic, args)
        if "notify" in args.only:
            await bench_notify_cost(pool, table, topic, args)
    finally:
        await pool.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await pool.close()


def parse_args() -> argparse.Namespace:
    settings = Settings()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", default=settings.dsn())
    parser.add_argument("--bootstrap", default=settings.kafka_servers())
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--samples", type=int, default=300, help="latency samples")
    parser.add_argument("--writers", type=int, default=16, help="concurrent writers in the NOTIFY bench")
    parser.add_argument("--notify-txns", type=int, default=8000, help="transactions per NOTIFY-bench run")
    parser.add_argument("--only", nargs="+", default=["backlog", "latency", "notify"])
    parser.add_argument("--no-uvloop", action="store_true")
    return parser.parse_args()


if __name__ == "__main__":
    configure_logging("WARNING", "kv")
    arguments = parse_args()
    if not arguments.no_uvloop:
        with contextlib.suppress(ImportError):
            import uvloop

            uvloop.install()
    asyncio.run(main(arguments))
