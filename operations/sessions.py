"""The console's sign-ins, held in a ``SessionStore`` (Postgres: ``saga.console_sessions``) so that signing out
ends them.

The session cookie carries a random token; the store holds its SHA-256, the operator and the session's CSRF
token, which every state-changing request of that session must echo (``console.guard``). A cookie kept from
before a sign-out, or past ``SESSION_S``, names no session and signs nobody in.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Protocol

from ..orchestrator.store.operations.sessions import MemorySessionStore
from .ports import SessionStore

SESSION_S = 12 * 3600
"""How long a sign-in lasts at most (a working day); signing out ends it earlier."""


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


class StoredSessions:
    """``Sessions`` over ``store``, each lasting ``lifetime_s`` at most."""

    def __init__(self, store: SessionStore, lifetime_s: float = SESSION_S) -> None:
        self._store = store
        self._lifetime_s = lifetime_s

    async def open(self, operator: str) -> Session:
        session = Session(token=secrets.token_urlsafe(32), operator=operator, csrf=secrets.token_urlsafe(32))
        await self._store.add(_digest(session.token), operator, session.csrf, self._lifetime_s)
        return session

    async def find(self, token: str) -> Session | None:
        found = await self._store.find(_digest(token))
        return None if found is None else Session(token=token, operator=found.operator, csrf=found.csrf)

    async def close(self, token: str) -> None:
        await self._store.remove(_digest(token))


def memory_sessions(lifetime_s: float = SESSION_S) -> StoredSessions:
    """``Sessions`` in this process only (tests, and a console without a database)."""
    return StoredSessions(MemorySessionStore(), lifetime_s)
