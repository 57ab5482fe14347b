"""The store port of the operations wing: what its use-cases read and write, not how a database provides it.

Each Protocol is sized to the use-case that calls it. Adapters: ``orchestrator.store.operations`` (one module per
concern, each with its Postgres and its memory adapter); both pass the same contract suite
(``tests/contract/``). Times are epoch milliseconds, as in ``orchestrator.ports``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..outbox.table import OutboxMessage

# -- reads of the console and the command line; the console's sessions; verify's snapshot; table signals --

# -- levers, the operator audit, bulk jobs, dead letters --


@dataclass(frozen=True)
class AuditEntry:
    """One row of the operator audit: who (``operator``) did what (``action``) to what (``target``, e.g. "saga
    t-1"), with what (``detail``) and what came of it (``outcome``); ``at_ms``: when it was written (0 before)."""

    operator: str
    action: str
    target: str
    detail: Mapping[str, Any]
    outcome: str
    at_ms: int = 0


class AuditStore(Protocol):
    """The operator audit: every action taken through the console or its API, refused ones too."""

    async def record(self, entry: AuditEntry) -> None:
        """Add ``entry`` (its time is the store's now)."""

    async def entries(self, limit: int) -> list[AuditEntry]:
        """The latest ``limit`` entries, newest first."""


class LeverStore(AuditStore, Protocol):
    """What a lever writes: its control commands into the orchestrator's outbox (its relay publishes them on
    saga.control) and its audit entry."""

    async def queue_lever(self, entry: AuditEntry, commands: Sequence[OutboxMessage], shards: Sequence[int]) -> None:
        """Write ``entry`` and ``commands`` (in outbox ``shards``, one per command) in one transaction: a lever is
        never published unaudited nor audited unpublished. Nothing is written when it raises."""
