"""What the console and its HTTP API read: the operator's reads (``operations.reads``) over the orchestrator's
tables, and the console's audit.

Every query runs under a statement timeout, so a slow database slows a page and never piles up connections behind
it; none takes a lock a service waits for.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from ..infra.db import datetime_to_ms
from ..operations.ports import AGE_BUCKETS
from ..operations.postgres import reads_store
from ..operations.reads import Reads, SagaView
from ..orchestrator.domain.definition import DefinitionRegistry
from ..participants.kit.participant import Participant
from ..schemas.registry import SchemaRegistry

__all__ = ["AGE_BUCKETS", "AuditEntry", "ConsoleReads", "SagaView"]

READ_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class AuditEntry:
    at_ms: int
    operator: str
    action: str
    target: str
    detail: dict[str, Any]
    outcome: str


class ConsoleReads(Reads):
    """The operator's reads over the orchestrator's database (``pool``), folding with ``definitions``; and the
    console's audit."""

    def __init__(self, pool: asyncpg.Pool, definitions: DefinitionRegistry, schemas: SchemaRegistry,
                 participants: Sequence[Participant] = ()) -> None:
        super().__init__(reads_store(pool), definitions, schemas, participants)
        self._pool = pool

    async def audit(self, limit: int = 200) -> list[AuditEntry]:
        rows = await self._pool.fetch(
            "SELECT at, operator, action, target, detail, outcome FROM saga.operator_audit ORDER BY id DESC LIMIT $1",
            limit, timeout=READ_TIMEOUT_S)
        return [AuditEntry(datetime_to_ms(r["at"]), r["operator"], r["action"], r["target"], json.loads(r["detail"]),
                           r["outcome"]) for r in rows]

    async def record(self, operator: str, action: str, target: str, detail: dict[str, Any], outcome: str,
                     conn: asyncpg.Connection | None = None) -> None:
        """Add an entry to the console's audit (saga.operator_audit); in ``conn``'s transaction when given."""
        await (conn or self._pool).execute(
            "INSERT INTO saga.operator_audit (operator, action, target, detail, outcome) VALUES ($1, $2, $3, $4, $5)",
            operator, action, target, json.dumps(detail, default=str), outcome, timeout=READ_TIMEOUT_S)


def epoch_ms(moment: datetime) -> int:
    return datetime_to_ms(moment)
