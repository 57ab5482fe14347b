"""Migrations and pool start-up on a real Postgres."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from saga_orchestrator.infra.db import apply_migrations, create_pool, migration_files
from saga_orchestrator.orchestrator.store.postgres import MIGRATIONS, migrate
from saga_orchestrator.outbox.table import outbox_table_sql

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
        expected = [path.stem for path in migration_files(MIGRATIONS)]
        assert sorted(results, key=len) == [[], [], expected]
        assert await migrate(conns[0]) == []
        recorded = await conns[0].fetch("SELECT version FROM saga.schema_migrations ORDER BY version")
        assert [r["version"] for r in recorded] == expected
        assert await conns[0].fetchval("SELECT to_regclass('public.schema_migrations')") is None
        tables = await conns[0].fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'saga' ORDER BY 1"
        )
        names = [t["table_name"] for t in tables]
        assert names == ["bulk_jobs", "console_sessions", "dead_letter_positions", "dead_letters", "definition_shapes",
                         "deployment", "events", "inbox",
                         "operator_audit", "outbox", "outbox_leases", "outbox_parked", "saga_summary",
                         "schema_migrations", "search_keys", "timers"]
    finally:
        for conn in conns:
            await conn.close()


async def test_a_failing_migration_leaves_no_trace(database_url: str, tmp_path: Path) -> None:
    (tmp_path / "001_ok.sql").write_text("CREATE TABLE public.mig_ok (id int);")
    (tmp_path / "002_bad.sql").write_text("CREATE TABLE public.mig_bad (id int); SELECT no_such_function();")
    conn = await asyncpg.connect(database_url)
    try:
        with pytest.raises(asyncpg.UndefinedFunctionError):
            await apply_migrations(conn, tmp_path, "public.mig_versions")
        assert await conn.fetchval("SELECT to_regclass('public.mig_bad')") is None
        assert await conn.fetchval("SELECT to_regclass('public.mig_ok')") is not None
        (tmp_path / "002_bad.sql").write_text("CREATE TABLE public.mig_bad (id int);")
        assert await apply_migrations(conn, tmp_path, "public.mig_versions") == ["002_bad"]
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
            parked = await _columns(conn, "saga", "outbox_parked")
            assert parked == await _columns(conn, "shape_check", "outbox_parked") and parked
    finally:
        await pool.close()


async def test_the_dead_letters_keep_their_dismissals_and_the_inbox_index_skips_them(database_url: str) -> None:
    pool = await create_pool(database_url, 2)
    try:
        await migrate(pool)
        async with pool.acquire() as conn:
            columns = {name: (kind, nullable) for name, kind, nullable, _ in
                       await _columns(conn, "saga", "dead_letters")}
            assert {name: columns[name] for name in ("dismissed_at_ms", "dismissed_by", "dismiss_reason")} == {
                "dismissed_at_ms": ("bigint", "YES"), "dismissed_by": ("text", "YES"),
                "dismiss_reason": ("text", "YES")}
            indexes = {row["indexname"]: row["indexdef"] for row in await conn.fetch(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'saga' AND tablename = 'dead_letters'")}
            assert "dead_letters_unreplayed_idx" not in indexes
            assert "(replayed_at_ms IS NULL) AND (dismissed_at_ms IS NULL)" in indexes["dead_letters_unhandled_idx"]
    finally:
        await pool.close()


async def test_create_pool_gives_up_after_its_connect_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(OSError):
        await create_pool("postgresql://saga@127.0.0.1:1/saga", 1, connect_timeout_s=0.5)
    assert time.monotonic() - started < 5


async def test_a_database_of_the_earlier_release_keeps_its_migrations_and_moves_their_records(
        postgres_admin_dsn: str) -> None:
    """Releases up to 0.1.0 recorded the migrations in public.schema_migrations (a name other tools use too):
    those records move to saga.schema_migrations, nothing is applied twice, and another tool's rows stay."""
    name = f"test_db_adopt_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(postgres_admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    conn = await asyncpg.connect(urlunsplit(urlsplit(postgres_admin_dsn)._replace(path=f"/{name}")))
    try:
        await apply_migrations(conn, MIGRATIONS, "public.schema_migrations")  # as 0.1.0 left a database
        await conn.execute("INSERT INTO saga.events (saga_id, seq, event_type, body) VALUES ('s-1', 1, 'X', 'x')")
        await conn.execute("INSERT INTO public.schema_migrations (version) VALUES ('20240101_other_tool')")

        assert await migrate(conn) == []
        moved = await conn.fetch("SELECT version FROM saga.schema_migrations ORDER BY version")
        assert [row["version"] for row in moved] == [path.stem for path in migration_files(MIGRATIONS)]
        left = await conn.fetch("SELECT version FROM public.schema_migrations")
        assert [row["version"] for row in left] == ["20240101_other_tool"]
        assert await conn.fetchval("SELECT count(*) FROM saga.events") == 1
        assert await migrate(conn) == []
    finally:
        await conn.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
