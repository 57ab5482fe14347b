"""Operating the rows an outbox relay parked (``<table>_parked``): list them, requeue them once the cause is
fixed (the topic's ``max.message.bytes`` raised, the topic created), or discard them.

A requeued row goes back into the outbox under its old id, so it is published before the rows of its key
that waited behind it; a discarded one is gone (its dead letter is the log line and this listing), and the
rows behind it go on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from ..infra.db import check_table
from .table import parked_table


@dataclass(frozen=True)
class ParkedRow:
    """A parked outbox row, without its value."""

    id: int
    topic: str
    key: str
    message_id: str
    size: int
    parked_at: datetime
    reason: str


async def list_parked(pool: asyncpg.Pool, table: str, key: str | None = None) -> list[ParkedRow]:
    """The rows parked from outbox ``table`` (of one key, when given), oldest first."""
    rows = await pool.fetch(
        f"""SELECT id, topic, message_key, message_id, octet_length(value) AS size, parked_at, reason
            FROM {parked_table(table)} WHERE $1::text IS NULL OR message_key = $1 ORDER BY id""", key)
    return [ParkedRow(row["id"], row["topic"], row["message_key"], row["message_id"], row["size"],
                      row["parked_at"], row["reason"]) for row in rows]


async def requeue_parked(pool: asyncpg.Pool, table: str, ids: list[int]) -> int:
    """Move the parked rows ``ids`` back into outbox ``table`` (their ids kept); how many moved."""
    moved: int = await pool.fetchval(
        f"""WITH back AS (DELETE FROM {parked_table(table)} WHERE id = ANY($1::bigint[]) RETURNING *),
                 put AS (INSERT INTO {check_table(table)} (id, topic, message_key, value, headers, message_id,
                                                           available_at, created_at, shard)
                         SELECT id, topic, message_key, value, headers, message_id, now(), created_at, shard
                         FROM back
                         RETURNING 1)
            SELECT count(*) FROM put""", ids)
    return moved


async def discard_parked(pool: asyncpg.Pool, table: str, ids: list[int]) -> int:
    """Delete the parked rows ``ids`` for good; how many there were."""
    deleted: int = await pool.fetchval(
        f"WITH gone AS (DELETE FROM {parked_table(table)} WHERE id = ANY($1::bigint[]) RETURNING 1)"
        " SELECT count(*) FROM gone", ids)
    return deleted
