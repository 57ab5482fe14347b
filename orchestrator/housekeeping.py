"""Housekeeping: the inbox forgets messages old enough that no redelivery can bring them back, and (when a
retention is set) ended sagas give up their events.

The inbox holds one row per handled message (its id) so that a redelivered message is skipped; it would
otherwise grow by about five rows per saga, forever. A message comes again after a consumer crash or a
rebalance (seconds later), after a relay crash (its rows are published again, minutes later at most), or when
a consumer group whose committed offsets expired reads its topics from the beginning: never once the topic has
dropped it. So rows older than the retention of the topics the orchestrator reads are of no further use. The
domain stays safe even then: a late reply changes nothing, a second start of a known saga is refused.
"""

from __future__ import annotations

import time

import asyncpg

from ..infra.chores import CHORE_EVERY_S, DELETE_BATCH, Chore, delete_older_sql, delete_older_than
from ..schemas.topics import Topics
from .domain.definition import DefinitionRegistry
from .purge import purge_ended
from .store.postgres import PostgresStore

RETENTION_OPERATOR = "retention policy"

_PRUNE_SQL = delete_older_sql("saga.inbox", ("consumer", "message_id"), "received_at")


async def prune_inbox(pool: asyncpg.Pool, retention_s: float, batch: int = DELETE_BATCH) -> int:
    """Delete the inbox rows received more than ``retention_s`` ago, a batch per transaction; how many."""
    return await delete_older_than(pool, _PRUNE_SQL, retention_s, batch)


def inbox_pruner(pool: asyncpg.Pool, retention_s: float, every_s: float = CHORE_EVERY_S) -> Chore:
    """The chore pruning the inbox every ``every_s``."""
    return Chore("inbox pruning", lambda: prune_inbox(pool, retention_s), every_s, retention_s=retention_s)


def retention_policy(store: PostgresStore, registry: DefinitionRegistry, topics: Topics, retention_s: float,
                     every_s: float = CHORE_EVERY_S) -> Chore:
    """The chore purging, every ``every_s``, the sagas that ended more than ``retention_s`` ago (as ``saga purge
    --ended-before`` would, recorded with the operator ``retention policy``)."""

    async def purge() -> int:
        now_ms = int(time.time() * 1000)
        return await purge_ended(store, registry, topics, ended_before_ms=now_ms - int(retention_s * 1000),
                                 now_ms=now_ms, operator=RETENTION_OPERATOR)

    return Chore("retention policy", purge, every_s, retention_s=retention_s)
