"""The console's sign-ins, held in Postgres (``saga.console_sessions``) so that signing out ends them.

The session cookie carries a random token; the table holds its SHA-256, the operator and the session's CSRF
token, which every state-changing request of that session must echo (``console.guard``). A cookie kept from
before a sign-out, or past ``SESSION_S``, names no session and signs nobody in.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import asyncpg

SESSION_S = 12 * 3600
"""How long a sign-in lasts at most (a working day); signing out ends it earlier."""
TABLE = "saga.console_sessions"


@dataclass(frozen=True)
class Session:
    """A signed-in operator: ``token`` is the cookie's value, ``csrf`` what its forms must send back."""

    token: str
    operator: str
    csrf: str


class Sessions(Protocol):
    """Where the console keeps its sign-ins."""

    async def open(self, operator: str) -> Session: ...

    async def find(self, token: str) -> Session | None: ...

    async def close(self, token: str) -> None: ...


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class PostgresSessions:
    """``Sessions`` in ``saga.console_sessions`` (every console replica sees every sign-in)."""

    def __init__(self, pool: asyncpg.Pool, lifetime: timedelta = timedelta(seconds=SESSION_S)) -> None:
        self._pool = pool
        self._lifetime = lifetime

    async def open(self, operator: str) -> Session:
        session = Session(token=secrets.token_urlsafe(32), operator=operator, csrf=secrets.token_urlsafe(32))
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(f"DELETE FROM {TABLE} WHERE expires_at < now()")  # the table keeps live ones only
            await conn.execute(f"INSERT INTO {TABLE} (token_sha256, operator, csrf, expires_at)"
                               " VALUES ($1, $2, $3, now() + $4)",
                               _digest(session.token), operator, session.csrf, self._lifetime)
        return session

    async def find(self, token: str) -> Session | None:
        row = await self._pool.fetchrow(f"SELECT operator, csrf FROM {TABLE}"
                                        " WHERE token_sha256 = $1 AND expires_at > now()", _digest(token))
        return None if row is None else Session(token=token, operator=row["operator"], csrf=row["csrf"])

    async def close(self, token: str) -> None:
        await self._pool.execute(f"DELETE FROM {TABLE} WHERE token_sha256 = $1", _digest(token))


class MemorySessions:
    """``Sessions`` in a dict (tests, and a console without a database): the same contract, one process."""

    def __init__(self) -> None:
        self._open: dict[bytes, Session] = {}

    async def open(self, operator: str) -> Session:
        session = Session(token=secrets.token_urlsafe(32), operator=operator, csrf=secrets.token_urlsafe(32))
        self._open[_digest(session.token)] = session
        return session

    async def find(self, token: str) -> Session | None:
        return self._open.get(_digest(token))

    async def close(self, token: str) -> None:
        self._open.pop(_digest(token), None)
