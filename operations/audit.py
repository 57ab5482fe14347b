"""The operator audit: every action an operator takes through the console or its API, and what came of it.

A saga's own stream records the levers pulled on it (``OperatorAction``); this record also holds what is no
saga's (a sign-in, a dead letter replayed, a bulk job started) and what was refused before reaching a saga."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .paging import Page, decode_cursor, page_of
from .ports import AuditEntry, AuditStore


class OperatorAudit:
    """Writes and reads the operator audit over ``store``."""

    def __init__(self, store: AuditStore) -> None:
        self._store = store

    async def record(self, operator: str, action: str, target: str, detail: Mapping[str, Any], outcome: str) -> None:
        """Add who did ``action`` on ``target`` (with ``detail``) and its ``outcome``."""
        await self._store.record(AuditEntry(operator, action, target, detail, outcome))

    async def entries(self, limit: int = 200) -> list[AuditEntry]:
        """The latest ``limit`` entries, newest first."""
        return await self._store.entries(limit)

    async def entry_page(self, limit: int = 200, cursor: str | None = None) -> Page[AuditEntry]:
        """One page of the entries, newest first: the first ``limit`` after ``cursor`` (a previous page's
        ``next_cursor``; the latest when None). BadCursor for a cursor no page gave. An entry's number is its own
        tie-breaker (the cursor's id part is empty)."""
        before = None if cursor is None else decode_cursor(cursor)[0]
        return page_of(await self._store.entries(limit + 1, before), limit, lambda entry: (entry.entry_id, ""))
