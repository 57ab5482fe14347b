"""The dead-letters page with a large index: its answer time, and the API's, with ``--letters`` letters indexed.

    python -m bench.dead_letters [--letters 100000] [--sagas 20000] [--requests 200] [--keep]

A fresh database gets the orchestrator's schema and ``--letters`` dead letters in its index (as the orchestrator
writes them: the letter's record with 1 KB of original value, spread over 8 saga.dlq partitions and ``--sagas``
sagas, failed over the last week). The console then answers, in this process, ``GET /dead-letters`` (the page, the
newest 100), ``GET /api/v1/dead-letters`` (the same as JSON), the API filtered to one saga and the inbox's dead
letters, ``--requests`` times each one after the other; the end is one table of p50 / p95 / max per request.
Needs Kafka only for the console's start; the letters are read from Postgres alone.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid

import asyncpg
import httpx
import uvloop
from rich.table import Table

from bench.probes import percentile
from bench.report import console
from bench.throughput import with_database
from bench.trip import TRIP_DEFINITIONS, TRIP_PARTICIPANTS
from saga_orchestrator.console.app import console_app
from saga_orchestrator.infra.logging import configure_logging
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.dead_letter_index import indexed
from saga_orchestrator.orchestrator.store.postgres import migrate
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.message_types import DeadLetter

PAGE_TARGET_MS = 100.0
PARTITIONS = 8
WEEK_MS = 7 * 86_400_000


def letters(count: int, sagas: int, now_ms: int) -> list[tuple[object, ...]]:
    """``count`` index rows, oldest first, as the orchestrator's indexer writes them."""
    rng = random.Random(7)
    rows: list[tuple[object, ...]] = []
    offsets = [0] * PARTITIONS
    value = bytes(rng.getrandbits(8) for _ in range(1024))
    for n in range(count):
        failed_at = now_ms - WEEK_MS + n * WEEK_MS // count
        saga_id = f"trip-{rng.randrange(sagas):06d}"
        partition = rng.randrange(PARTITIONS)
        record = wire.encode_dead_letter(DeadLetter(
            source_topic="trip.flight.results", source_partition=partition, source_offset=n,
            consumer="orchestrator", reason=f"reply refused: no attempt {n % 7} of book_flight", failed_at=failed_at,
            saga_id=saga_id, original_key=saga_id.encode(), original_value=value,
            original_headers=(("message_id", f"m-{n}".encode()),)))
        row = indexed(partition, offsets[partition], failed_at + 3, record)
        offsets[partition] += 1
        rows.append((row.partition, row.offset, row.written_at_ms, row.failed_at_ms, row.saga_id, row.source_topic,
                     row.reason, row.record, None))
    return rows


async def fill(dsn: str, count: int, sagas: int) -> None:
    """Migrate and index ``count`` letters, then analyze (as autovacuum would have by then)."""
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn)
        rows = letters(count, sagas, time.time_ns() // 1_000_000)
        await conn.copy_records_to_table("dead_letters", schema_name="saga", records=rows, columns=[
            "dlq_partition", "dlq_offset", "written_at_ms", "failed_at_ms", "saga_id", "source_topic", "reason",
            "record", "replayed_at_ms"])
        await conn.execute("ANALYZE saga.dead_letters")
    finally:
        await conn.close()


async def measure(settings: Settings, requests: int) -> dict[str, list[float]]:
    """Each path's answer times (ms), asked ``requests`` times one after the other."""
    paths = {"page /dead-letters": "/dead-letters", "api /api/v1/dead-letters": "/api/v1/dead-letters",
             "api, one saga": "/api/v1/dead-letters?saga=trip-000042",
             "inbox, dead letters": "/api/v1/inbox?kind=dead_letter"}
    times: dict[str, list[float]] = {name: [] for name in paths}
    app = console_app(settings)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://console") as client:
        for name, path in paths.items():
            for n in range(requests + 5):
                began = time.perf_counter()
                answer = await client.get(path)
                took = (time.perf_counter() - began) * 1000
                answer.raise_for_status()
                if n >= 5:  # the first few warm the pool and the templates
                    times[name].append(took)
    return times


async def run(args: argparse.Namespace) -> None:
    base = Settings()
    admin_dsn = args.admin_dsn or base.dsn()
    database = f"bench_dlq_{uuid.uuid4().hex[:8]}"
    settings = base.model_copy(update={"database_url": with_database(admin_dsn, database),
                                       "saga_topic_prefix": f"bench-{database}.",
                                       "saga_definitions": TRIP_DEFINITIONS, "saga_participants": TRIP_PARTICIPANTS})
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{database}"')
    try:
        with console.status(f"indexing {args.letters:,} letters"):
            await fill(settings.dsn(), args.letters, args.sagas)
        with console.status(f"{args.requests} requests of each"):
            times = await measure(settings, args.requests)
        table = Table("request", "p50 ms", "p95 ms", "max ms",
                      title=f"{args.letters:,} dead letters indexed (target p95 < {PAGE_TARGET_MS:g} ms)")
        for name, took in times.items():
            took.sort()
            table.add_row(name, f"{percentile(took, 0.5):.1f}", f"{percentile(took, 0.95):.1f}", f"{took[-1]:.1f}")
        console.print(table)
    finally:
        if not args.keep:
            await admin.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
        await admin.close()


def main() -> None:
    """Command-line entry."""
    configure_logging("WARNING", "kv")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--letters", type=int, default=100_000, help="dead letters in the index")
    parser.add_argument("--sagas", type=int, default=20_000, help="sagas they belong to")
    parser.add_argument("--requests", type=int, default=200, help="requests of each kind")
    parser.add_argument("--admin-dsn", default=None, help="DSN allowed to CREATE DATABASE (default: DATABASE_URL)")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    uvloop.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
