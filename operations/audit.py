"""The operator audit: every action an operator takes through the console or its API, and what came of it.

A saga's own stream records the levers pulled on it (``OperatorAction``); this record also holds what is no
saga's (a sign-in, a dead letter replayed, a bulk job started) and what was refused before reaching a saga."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
