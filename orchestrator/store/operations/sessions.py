"""The operations wing's ``SessionStore``: the console's sign-ins in ``<schema>.console_sessions``
(``PostgresSessionStore``: every console replica sees every sign-in) or in a dict (``MemorySessionStore``)."""

from __future__ import annotations

import time
from datetime import timedelta

import asyncpg

from ....infra.db import check_identifier
from ....operations.ports import StoredSession


class PostgresSessionStore:
    """``SessionStore`` in the orchestrator's ``schema``."""

    def __init__(self, pool: asyncpg.Pool, schema: str = "saga") -> None:
        self._pool = pool
        self._table = f"{check_identifier(schema)}.console_sessions"

    async def add(self, digest: bytes, operator: str, csrf: str, lifetime_s: float) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(f"DELETE FROM {self._table} WHERE expires_at < now()")  # it keeps live ones only
            await conn.execute(f"INSERT INTO {self._table} (token_sha256, operator, csrf, expires_at)"
                               " VALUES ($1, $2, $3, now() + $4)", digest, operator, csrf,
                               timedelta(seconds=lifetime_s))

    async def find(self, digest: bytes) -> StoredSession | None:
        row = await self._pool.fetchrow(f"SELECT operator, csrf FROM {self._table}"
                                        " WHERE token_sha256 = $1 AND expires_at > now()", digest)
        return None if row is None else StoredSession(row["operator"], row["csrf"])

    async def remove(self, digest: bytes) -> None:
        await self._pool.execute(f"DELETE FROM {self._table} WHERE token_sha256 = $1", digest)


class MemorySessionStore:
    """``SessionStore`` in a dict (tests, one process): the same contract, expiry by the monotonic clock."""

    def __init__(self) -> None:
        self._open: dict[bytes, tuple[float, StoredSession]] = {}

    async def add(self, digest: bytes, operator: str, csrf: str, lifetime_s: float) -> None:
        now = time.monotonic()
        self._open = {key: held for key, held in self._open.items() if held[0] > now}
        self._open[digest] = (now + lifetime_s, StoredSession(operator, csrf))

    async def find(self, digest: bytes) -> StoredSession | None:
        held = self._open.get(digest)
        return held[1] if held is not None and held[0] > time.monotonic() else None

    async def remove(self, digest: bytes) -> None:
        self._open.pop(digest, None)
