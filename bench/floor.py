"""The CPU floor of a trip on this machine: what the parts a trip cannot do without cost one at a time.

    python -m bench.floor [--round-trips 600] [--rate 135] [--idle-seconds 20] [--admin-dsn DSN]

A quiet stack at low rates hands each message on alone (a batch of one: waiting for a second one would be
latency), so the CPU of a trip is at least the sum of its single-message costs. Measured on the configured
Kafka and Postgres, with clients configured as the services configure theirs:

- the broker and Postgres with no client of this bench connected (``--idle-seconds``);
- one Kafka hop: an idempotent acks=all producer with no linger sends one keyed record, and a consumer
  assigned every partition of six topics (as the orchestrator is) long-polls it; paced at ``--rate``;
- one Postgres transaction as a step takes it: BEGIN, an idempotency-key row, a business row, COMMIT.

Each is reported as CPU per operation of this process and of the server. A trip needs at least nine hops
(StartSaga, four commands, four replies) and nine transactions (five orchestrator decisions, four steps); the
floor leaves out everything else a trip does (its events on saga.events, the relays' outbox reads and deletes,
offset commits, the orchestrator's fold and decide, the participants' frameworks).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import uvloop
from aiokafka import TopicPartition
from rich.table import Table

from bench.probes import MACHINE, Watched, cpu_delta, sample_cpu
from bench.report import console
from bench.throughput import with_database
from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.kafka_admin import delete_topics, ensure_topics
from saga_orchestrator.infra.launcher.kafka import KafkaLauncher
from saga_orchestrator.infra.launcher.postgres import PostgresLauncher
from saga_orchestrator.infra.settings import Settings

HOPS_PER_TRIP = 9
TRANSACTIONS_PER_TRIP = 9
WARM_UP_S = 5.0  # of each kind before measuring (a broker started minutes ago costs more still: its JIT)
CLIENT = "bench (this)"
CONSUMED_TOPICS = 6  # the orchestrator's: saga.start, saga.control and four results topics


class Meter:
    """CPU seconds of this process and the given servers between ``start`` and ``stop`` (``used``, by label;
    the client's under ``CLIENT``)."""

    def __init__(self, broker: Watched | None, postgres: Watched | None) -> None:
        self._watched = [Watched(CLIENT, os.getpid()), *(w for w in (broker, postgres) if w is not None)]
        self._before: dict[str, float] = {}
        self._started_at = 0.0
        self.used: dict[str, float] = {}

    def start(self) -> None:
        self._before = sample_cpu(self._watched)
        self._started_at = time.monotonic()

    def stop(self) -> float:
        """Set ``used``; the wall-clock seconds since ``start``."""
        used = cpu_delta(self._before, sample_cpu(self._watched))
        used.pop(MACHINE, None)
        self.used = used
        return time.monotonic() - self._started_at


async def paced(count: int, rate: float, operation: Callable[[], Awaitable[None]]) -> list[float]:
    """Run ``operation()`` ``count`` times, one at a time, started ``1 / rate`` apart; latency of each (ms)."""
    latencies = []
    start = time.monotonic()
    for index in range(count):
        delay = start + index / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        began = time.monotonic()
        await operation()
        latencies.append((time.monotonic() - began) * 1000)
    return sorted(latencies)


async def measured(meter: Meter, count: int, rate: float, operation: Callable[[], Awaitable[None]]) -> list[float]:
    """``paced`` after ``WARM_UP_S`` of the same (the broker's JIT, the clients' connections), metered."""
    await paced(int(rate * WARM_UP_S), rate, operation)
    meter.start()
    latencies = await paced(count, rate, operation)
    meter.stop()
    return latencies


async def kafka_hops(settings: Settings, meter: Meter, count: int, rate: float, topics: int) -> list[float]:
    kafka = settings.kafka()
    prefix = f"floor-{uuid.uuid4().hex[:8]}."
    names = [f"{prefix}t{index}" for index in range(topics)]
    partitions = settings.saga_topic_partitions
    await ensure_topics(kafka, names, partitions)
    producer = kafka.producer(acks="all", enable_idempotence=True, linger_ms=0)
    consumer = kafka.consumer(enable_auto_commit=False, fetch_min_bytes=1, fetch_max_wait_ms=500,
                              auto_offset_reset="latest")
    await producer.start()
    await consumer.start()
    try:
        consumer.assign([TopicPartition(name, p) for name in names for p in range(partitions)])
        await consumer.seek_to_end()
        await producer.send_and_wait(names[0], b"warm-up", key=b"warm-up")
        await consumer.getone()

        async def hop() -> None:
            await producer.send_and_wait(names[0], b"x" * 200, key=uuid.uuid4().bytes)
            await consumer.getone()

        return await measured(meter, count, rate, hop)
    finally:
        await consumer.stop()
        await producer.stop()
        await delete_topics(kafka, names)


async def transactions(dsn: str, meter: Meter, count: int, rate: float) -> list[float]:
    pool = await create_pool(dsn, 2, application_name="saga-floor")
    try:
        await pool.execute("CREATE TABLE keys (message_id text PRIMARY KEY);"
                           " CREATE TABLE business (id text PRIMARY KEY, body text NOT NULL)")

        async def step() -> None:
            key = uuid.uuid4().hex
            async with pool.acquire() as conn, conn.transaction():
                await conn.fetchval("INSERT INTO keys VALUES ($1) ON CONFLICT DO NOTHING RETURNING 1", key)
                await conn.execute("INSERT INTO business VALUES ($1, $2)", key, "booked")

        return await measured(meter, count, rate, step)
    finally:
        await pool.close()


def per_op(meter: Meter, count: int) -> dict[str, float]:
    return {label: used * 1000 / count for label, used in meter.used.items()}


async def run(args: argparse.Namespace) -> None:
    settings = Settings()
    broker_pid, postgres_pid = KafkaLauncher(settings).pid(), PostgresLauncher(settings).pid()
    broker = Watched("kafka (whole broker)", broker_pid) if broker_pid else None
    postgres = Watched("postgres (whole server)", postgres_pid, tree=True) if postgres_pid else None
    for watched, name in ((broker, "Kafka"), (postgres, "Postgres")):
        if watched is None:
            console.print(f"[yellow]{name} is not run by the local launcher (saga infra up): its CPU is not "
                          "counted, and the floor below leaves it out[/yellow]")

    idle = Table(title=f"servers with no client of this bench, {args.idle_seconds:g} s")
    idle.add_column("process")
    idle.add_column("% of one core", justify="right")
    meter = Meter(broker, postgres)
    meter.start()
    await asyncio.sleep(args.idle_seconds)
    wall = meter.stop()
    idle_share = {label: used / wall * 100 for label, used in meter.used.items() if label != CLIENT}
    for label, share in idle_share.items():
        idle.add_row(label, f"{share:.2f}%")
    console.print(idle)

    hops_meter = Meter(broker, None)
    hop_latency = await kafka_hops(settings, hops_meter, args.round_trips, args.rate, args.consumed_topics)
    database = f"floor_{uuid.uuid4().hex[:8]}"
    admin_dsn = args.admin_dsn or settings.dsn()
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f"CREATE DATABASE {database}")
    try:
        tx_meter = Meter(None, postgres)
        tx_latency = await transactions(with_database(admin_dsn, database), tx_meter, args.round_trips, args.rate)
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        await admin.close()

    hop_cpu, tx_cpu = per_op(hops_meter, args.round_trips), per_op(tx_meter, args.round_trips)
    table = Table(title=f"one operation at a time, {args.round_trips} of each at {args.rate:g}/s")
    for column in ("operation", "p50 ms", "client CPU ms", "server CPU ms", "total CPU ms"):
        table.add_column(column, justify="left" if column == "operation" else "right")
    floor = 0.0
    for name, latency, cpu, times in (("Kafka hop (produce, ack, fetch)", hop_latency, hop_cpu, HOPS_PER_TRIP),
                                      ("Postgres step transaction", tx_latency, tx_cpu, TRANSACTIONS_PER_TRIP)):
        client = cpu[CLIENT]
        server = sum(used for label, used in cpu.items() if label != CLIENT)
        floor += times * (client + server)
        table.add_row(name, f"{latency[len(latency) // 2]:.1f}", f"{client:.2f}", f"{server:.2f}",
                      f"{client + server:.2f}")
    console.print(table)
    console.print(f"floor of a trip at one message per batch: {HOPS_PER_TRIP} hops + {TRANSACTIONS_PER_TRIP} "
                  f"transactions = {floor:.1f} ms of CPU")
    servers_idle = sum(idle_share.values())
    for rate in (15, 50):
        console.print(f"  at {rate} sagas/s the idle servers alone add {servers_idle * 10 / rate:.2f} ms per saga "
                      f"({servers_idle:.2f}% of a core)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--round-trips", type=int, default=600, help="operations of each kind measured")
    parser.add_argument("--rate", type=float, default=135.0,
                        help="operations per second (135: the hops of 15 trips a second)")
    parser.add_argument("--consumed-topics", type=int, default=CONSUMED_TOPICS,
                        help="topics the hop's consumer is assigned (every partition of each)")
    parser.add_argument("--admin-dsn", default=None, help="DSN allowed to CREATE DATABASE (default: DATABASE_URL)")
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="how long the idle servers are measured")
    uvloop.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
