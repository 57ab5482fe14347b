"""The real database: round trips through asyncpg, and a transaction that rolls back."""

from __future__ import annotations

import asyncpg
import pytest


class _Abort(Exception):
    """Raised inside a transaction to make it roll back."""


async def test_round_trip_and_rollback(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT current_database()") == database_url.rsplit("/", 1)[1]
        await conn.execute("CREATE TABLE notes (id bigserial PRIMARY KEY, body text NOT NULL, data bytea)")
        await conn.executemany(
            "INSERT INTO notes (body, data) VALUES ($1, $2)", [("first", b"\x00\x01"), ("second", None)]
        )
        rows = await conn.fetch("SELECT body, data FROM notes ORDER BY id")
        assert [(row["body"], row["data"]) for row in rows] == [("first", b"\x00\x01"), ("second", None)]

        with pytest.raises(_Abort):
            async with conn.transaction():
                await conn.execute("INSERT INTO notes (body) VALUES ('rolled back')")
                assert await conn.fetchval("SELECT count(*) FROM notes") == 3  # visible inside
                raise _Abort

        assert await conn.fetchval("SELECT count(*) FROM notes") == 2
        assert await conn.fetchval("SELECT count(*) FROM notes WHERE body = 'rolled back'") == 0
    finally:
        await conn.close()


async def test_each_module_gets_its_own_empty_database(database_url: str, postgres_admin_dsn: str) -> None:
    assert database_url != postgres_admin_dsn
    conn = await asyncpg.connect(database_url)
    try:
        # The previous test's table lives in this module's database; nothing else does.
        tables = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        assert [row["tablename"] for row in tables] == ["notes"]
    finally:
        await conn.close()
