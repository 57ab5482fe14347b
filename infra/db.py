"""Postgres connection pool and the migration runner (ordered plain SQL files, each applied once)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from .failures import Fault, classify
from .misconfigured import Misconfigured

log = logging.getLogger(__name__)

# Every service runs its migrations at start; this session-level advisory lock makes concurrent starters
# queue up instead of racing on CREATE TABLE. The number is arbitrary but fixed (ASCII "sagamigr").
_MIGRATION_LOCK_KEY = 0x736167616D696772

# Plan every statement for its actual arguments and the tables' current size. Postgres switches a prepared
# statement to a cached generic plan after a few calls; one made while a table was nearly empty (a fresh
# database, an idle outbox or timer queue) stays in use after the table has grown to thousands of rows and
# then scans the whole table, or worse (measured in bench/throughput.py: a timer delete became a nested
# loop over the whole table, Postgres CPU per saga x25). A fresh plan per call costs a little CPU. No JIT:
# these are short statements, and compiling one takes longer than running it.
SERVER_SETTINGS = {"plan_cache_mode": "force_custom_plan", "jit": "off"}


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Released connections skip asyncpg's reset query (advisory unlock, CLOSE ALL, UNLISTEN, RESET ALL):
    it is one more round trip per transaction, for every service, and nothing here leaves session state
    behind (the relay and the migration runner release their advisory locks themselves). An open
    transaction is still rolled back by the pool before this runs."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


def check_identifier(name: str) -> str:
    """Return ``name`` if it is a plain lower-case SQL identifier; table and schema names are spliced into
    SQL text, so anything else is refused."""
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError(f"not a plain SQL identifier: {name!r}")
    return name


def check_table(table: str) -> str:
    """Return ``table`` if it is ``name`` or ``schema.name`` made of plain identifiers."""
    for part in table.split("."):
        check_identifier(part)
    if table.count(".") > 1:
        raise ValueError(f"not a table name: {table!r}")
    return table


def ms_to_datetime(epoch_ms: int) -> datetime:
    """Epoch milliseconds → aware UTC datetime, exactly (no float rounding)."""
    return _EPOCH + timedelta(milliseconds=epoch_ms)


def datetime_to_ms(moment: datetime) -> int:
    """Aware datetime → epoch milliseconds (sub-millisecond part truncated)."""
    return (moment - _EPOCH) // timedelta(milliseconds=1)


async def create_pool(
    dsn: str,
    size: int,
    *,
    connect_timeout_s: float = 30.0,
    command_timeout_s: float | None = 60.0,
    application_name: str = "saga",
) -> asyncpg.Pool:
    """Open a pool of up to ``size`` connections, retrying with backoff until ``connect_timeout_s``.

    The retry covers start-up ordering: a service started together with Postgres waits for it instead of
    crashing. Authentication and unknown-database errors are not retried. ``application_name`` names the
    connections in ``pg_stat_activity`` (e.g. ``saga-orchestrator``), so an operator sees who holds what.
    """
    deadline = time.monotonic() + connect_timeout_s
    delay = 0.1
    attempt = 0
    while True:
        attempt += 1
        try:
            pool = await asyncpg.create_pool(
                dsn, min_size=min(2, size), max_size=size, command_timeout=command_timeout_s,
                server_settings={**SERVER_SETTINGS, "application_name": application_name},
                reset=_keep_session,
            )
            return pool
        except Exception as exc:
            if classify(exc) is not Fault.PLATFORM or time.monotonic() + delay > deadline:
                raise
            log.warning(
                "postgres not reachable yet, retrying",
                extra={"attempt": attempt, "retry_in_s": delay, "error": repr(exc)},
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


def migration_files(directory: Path) -> list[Path]:
    """The ``*.sql`` files of ``directory`` in application order (file name order: 001_, 002_, ...)."""
    return sorted(directory.glob("*.sql"))


async def apply_migrations(conn_or_pool: asyncpg.Connection | asyncpg.Pool, directory: Path, table: str,
                           *, adopt_from: str | None = None) -> list[str]:
    """Apply every migration of ``directory`` not yet recorded in ``table`` (``schema.name``); the versions
    applied now.

    A version is the file name without ``.sql``. Each file runs in its own transaction together with its row
    in ``table``, so a failing file leaves no trace and is retried next time. ``adopt_from`` names a table an
    earlier release recorded these versions in: rows of ours found there move to ``table`` first (and the
    old table goes once nothing else is left in it).
    """
    if isinstance(conn_or_pool, asyncpg.Pool):
        async with conn_or_pool.acquire() as conn:
            return await _migrate(conn, directory, check_table(table), adopt_from)
    return await _migrate(conn_or_pool, directory, check_table(table), adopt_from)


class MigrationsPending(Misconfigured):
    """The schema is behind and the connected role may not run DDL: the migration role has to."""


async def _applied(conn: asyncpg.Connection, table: str) -> set[str]:
    """The versions ``table`` records (none when it does not exist); read-only."""
    if await conn.fetchval("SELECT to_regclass($1)", table) is None:
        return set()
    return {row["version"] for row in await conn.fetch(f"SELECT version FROM {table}")}


async def _migrate(conn: asyncpg.Connection, directory: Path, table: str, adopt_from: str | None) -> list[str]:
    files = migration_files(directory)
    # Up to date: nothing to do, and no DDL a least-privilege role could not run (infra.roles).
    if {path.stem for path in files} <= await _applied(conn, table):
        return []
    try:
        return await _migrate_locked(conn, files, table, adopt_from)
    except asyncpg.InsufficientPrivilegeError as error:
        role = await conn.fetchval("SELECT current_user")
        raise MigrationsPending(
            f"the tables of {table.partition('.')[0]} are missing or behind, and role {role} may not create them "
            f"({error}): run `saga migrate` with the DATABASE_URL of the migration role first") from error


async def _migrate_locked(conn: asyncpg.Connection, files: list[Path], table: str, adopt_from: str | None
                          ) -> list[str]:
    await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK_KEY)
    try:
        schema = table.partition(".")[0] if "." in table else "public"
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        await conn.execute(f"CREATE TABLE IF NOT EXISTS {table} ("
                           " version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
        if adopt_from is not None:
            await _adopt(conn, table, check_table(adopt_from), [path.stem for path in files])
        done = {row["version"] for row in await conn.fetch(f"SELECT version FROM {table}")}
        applied: list[str] = []
        for path in files:
            version = path.stem
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(path.read_text(encoding="utf-8"))
                await conn.execute(f"INSERT INTO {table} (version) VALUES ($1)", version)
            log.info("migration applied", extra={"version": version, "table": table})
            applied.append(version)
        return applied
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK_KEY)


async def _adopt(conn: asyncpg.Connection, table: str, old_table: str, versions: list[str]) -> None:
    """Move the rows of ``versions`` from ``old_table`` to ``table``; drop ``old_table`` when that emptied it."""
    if await conn.fetchval("SELECT to_regclass($1)", old_table) is None:
        return
    async with conn.transaction():
        moved = await conn.fetch(f"DELETE FROM {old_table} WHERE version = ANY($1::text[])"
                                 " RETURNING version, applied_at", versions)
        if not moved:
            return
        await conn.execute(f"INSERT INTO {table} (version, applied_at)"
                           " SELECT * FROM unnest($1::text[], $2::timestamptz[]) ON CONFLICT DO NOTHING",
                           [row["version"] for row in moved], [row["applied_at"] for row in moved])
        if not await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM {old_table})"):
            await conn.execute(f"DROP TABLE {old_table}")
        log.info("migration records moved", extra={"from": old_table, "to": table, "versions": len(moved)})
