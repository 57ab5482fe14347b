"""How long ``version_counts`` (the sagas running and ended per saga type and definition version, what ``saga
definitions`` and the console's Definitions page show) takes over a large read model.

    python -m bench.version_counts [--rows 1000000] [--repeat 5] [--admin-dsn DSN]

Fills ``saga.saga_summary`` of a fresh database (``bench_<hex>``, dropped at the end) with ``--rows`` rows over 3
saga types by 3 versions, one shape each, in mixed states (most ended, as in a deployment that has run a while),
runs ANALYZE, prints the query's plan and the median of ``--repeat`` reads; then the same after a VACUUM, which
sets the visibility map an index-only scan needs to skip the table (autovacuum does it on a live system).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import asyncpg

from bench.report import console
from bench.throughput import with_database
from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.postgres import migrate, reads_store
from saga_orchestrator.operations.versions import version_counts
from saga_orchestrator.orchestrator.store.operations.reads import VERSION_COUNTS_SQL

TYPES = ("trip", "refund", "onboarding")
VERSIONS = 3
# One row in 20 of each: most sagas ended, a tenth still run or wait for someone.
STATUSES = ("COMPLETED",) * 12 + ("COMPENSATED",) * 3 + ("CANCELLED", "COMPLETED_WITH_FAILURES", "RUNNING",
                                                          "COMPENSATING", "QUARANTINED")


async def fill(pool: asyncpg.Pool, rows: int) -> None:
    """``rows`` read-model rows in one INSERT ... SELECT: type, version and state each cycle with another period,
    so every (type, version) holds every state."""
    await pool.execute(
        "INSERT INTO saga.saga_summary (saga_id, saga_type, status, started_at, updated_at, last_seq,"
        "                               definition_version, definition_fingerprint)"
        " SELECT 'bench-' || n, ($2::text[])[1 + n % 3], ($3::text[])[1 + (n * 7) % cardinality($3::text[])],"
        "        now() - (n % 2592000) * interval '1 second', now() - (n % 2592000) * interval '1 second', 12,"
        "        1 + (n / 3) % $4, md5(($2::text[])[1 + n % 3] || ((n / 3) % $4))::text"
        " FROM generate_series(1, $1) AS n", rows, list(TYPES), list(STATUSES), VERSIONS, timeout=None)


async def timed(pool: asyncpg.Pool, repeat: int) -> tuple[float, int]:
    """The median time of ``repeat`` reads (s), and how many (type, version) rows the last one gave."""
    store, times, found = reads_store(pool), [], []
    for _ in range(repeat):
        started = time.perf_counter()
        found = await version_counts(store)
        times.append(time.perf_counter() - started)
    return statistics.median(times), len(found)


async def plan(pool: asyncpg.Pool) -> str:
    rows = await pool.fetch("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + VERSION_COUNTS_SQL.format(schema="saga"))
    return "\n".join("    " + row[0] for row in rows)


async def run(args: argparse.Namespace) -> None:
    admin_dsn = args.admin_dsn or Settings().dsn()
    database = f"bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{database}"')
    try:
        pool = await create_pool(with_database(admin_dsn, database), 2, command_timeout_s=None)
        try:
            await migrate(pool)
            started = time.perf_counter()
            await fill(pool, args.rows)
            await pool.execute("ANALYZE saga.saga_summary")
            console.print(f"{args.rows:,} rows over {len(TYPES)} types by {VERSIONS} versions filled and analyzed in "
                          f"{time.perf_counter() - started:.1f} s")
            for label in ("after ANALYZE", "after VACUUM"):
                if label == "after VACUUM":
                    await pool.execute("VACUUM (ANALYZE) saga.saga_summary", timeout=None)
                median, versions = await timed(pool, args.repeat)
                console.print(f"[bold]version_counts {label}: median {median * 1000:.0f} ms[/] of {args.repeat} "
                              f"reads ({versions} type-version rows)")
                print(await plan(pool), flush=True)  # whole lines: the plan is read, not laid out
        finally:
            await pool.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="read-model rows")
    parser.add_argument("--repeat", type=int, default=5, help="reads timed; the median is printed")
    parser.add_argument("--admin-dsn", default=None, help="DSN allowed to CREATE DATABASE (default: DATABASE_URL)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
