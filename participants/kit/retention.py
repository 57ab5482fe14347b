"""Idempotency records are kept for a retention, then deleted: the table would otherwise grow by a row per
command, forever.

A record answers a redelivered command with its recorded reply. A command comes again after a worker crash or
a rebalance (seconds later), when the orchestrator retries a step whose reply it has not seen (within that
step's retry schedule), or when a consumer group whose offsets expired reads ``<p>.commands`` from the
beginning: never once the topic has dropped it. Compensations look the business record up, not this one.
A key still awaiting its deferred answer is kept, however old.
"""

from __future__ import annotations

import asyncpg

from ...infra.chores import CHORE_EVERY_S, DELETE_BATCH, Chore, delete_older_sql, delete_older_than
from .replies import AWAITING


def _prune_sql(schema: str) -> str:
    return delete_older_sql(f"{schema}.processed_commands", ("idempotency_key",), "processed_at",
                            also=f"status <> '{AWAITING}'")


async def prune_processed_commands(pool: asyncpg.Pool, schema: str, retention_s: float,
                                   batch: int = DELETE_BATCH) -> int:
    """Delete ``<schema>.processed_commands`` rows handled more than ``retention_s`` ago; how many."""
    return await delete_older_than(pool, _prune_sql(schema), retention_s, batch)


def record_pruner(pool: asyncpg.Pool, schema: str, retention_s: float, every_s: float = CHORE_EVERY_S) -> Chore:
    """The chore pruning a participant's idempotency records every ``every_s``."""
    return Chore("idempotency record pruning", lambda: prune_processed_commands(pool, schema, retention_s),
                 every_s, schema=schema, retention_s=retention_s)
