"""Migrations and pool start-up on a real Postgres."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg
import pytest

from saga_orchestrator.infra.db import create_pool, migrate, migration_files
from saga_orchestrator.outbox.writer import outbox_table_sql

pytestmark = pytest.mark.integration


async def _columns(conn: asyncpg.Connection, schema: str, table: str) -> list[tuple[str, str, str, str]]:
    rows = await conn.fetch(
        "SELECT column_name, data_type, is_nullable, coalesce(column_default, '') AS d"
        " FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2"
        " ORDER BY ordinal_position",
        schema,
        table,
    )
    # A serial default names its own sequence; compare the rest.
    return [(r[0], r[1], r[2], r[3].replace(f"{schema}.", "")) for r in rows]


async def test_migrate_applies_each_file_once_even_with_concurrent_starters(database_url: str) -> None:
    conns = [await asyncpg.connect(database_url) for _ in range(3)]
    try:
        results = await asyncio.gather(*(migrate(conn) for conn in conns))
        expected = [path.stem for path in migration_files()]
        assert sorted(results, key=len) == [[], [], expected]
        assert await migrate(conns[0]) == []
        recorded = await conns[0].fetch("SELECT version FROM public.schema_migrations ORDER BY version")
        assert [r["version"] for r in recorded if r["version"] in expected] == expected
        tables = await conns[0].fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'saga' ORDER BY 1"
        )
        names = [t["table_name"] for t in tables]
        assert names == ["deployment", "events", "inbox", "outbox", "saga_summary", "timers"]
    finally:
        for conn in conns:
            await conn.close()


async def test_a_failing_migration_leaves_no_trace(database_url: str, tmp_path: Path) -> None:
    (tmp_path / "001_ok.sql").write_text("CREATE TABLE public.mig_ok (id int);")
    (tmp_path / "002_bad.sql").write_text("CREATE TABLE public.mig_bad (id int); SELECT no_such_function();")
    conn = await asyncpg.connect(database_url)
    try:
        with pytest.raises(asyncpg.UndefinedFunctionError):
            await migrate(conn, tmp_path)
        assert await conn.fetchval("SELECT to_regclass('public.mig_bad')") is None
        assert await conn.fetchval("SELECT to_regclass('public.mig_ok')") is not None
        (tmp_path / "002_bad.sql").write_text("CREATE TABLE public.mig_bad (id int);")
        assert await migrate(conn, tmp_path) == ["002_bad"]
    finally:
        await conn.close()


async def test_saga_outbox_has_the_shape_of_every_outbox(database_url: str) -> None:
    pool = await create_pool(database_url, 2)
    try:
        await migrate(pool)
        async with pool.acquire() as conn:
            await conn.execute(outbox_table_sql("shape_check"))
            await conn.execute(outbox_table_sql("shape_check"))  # idempotent
            assert await _columns(conn, "saga", "outbox") == await _columns(conn, "shape_check", "outbox")
    finally:
        await pool.close()


async def test_create_pool_gives_up_after_its_connect_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(OSError):
        await create_pool("postgresql://saga@127.0.0.1:1/saga", 1, connect_timeout_s=0.5)
    assert time.monotonic() - started < 5
