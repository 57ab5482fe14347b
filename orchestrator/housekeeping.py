"""Housekeeping: the inbox forgets messages old enough that no redelivery can bring them back.

The inbox holds one row per handled message (its id) so that a redelivered message is skipped; it would
otherwise grow by about five rows per saga, forever. A message comes again after a consumer crash or a
rebalance (seconds later), after a relay crash (its rows are published again, minutes later at most), or when
a consumer group whose committed offsets expired reads its topics from the beginning: never once the topic has
dropped it. So rows older than the retention of the topics the orchestrator reads are of no further use. The
domain stays safe even then: a late reply changes nothing, a second start of a known saga is refused.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from infra.startup import sleep_or_stop

log = logging.getLogger("saga.orchestrator.housekeeping")

PRUNE_EVERY_S = 600.0
PRUNE_BATCH = 5_000

# Oldest first, a batch at a time (short transactions, short locks); SKIP LOCKED so that two orchestrators
# pruning at once do not wait on each other.
_PRUNE_SQL = """
WITH old AS (
    SELECT consumer, message_id FROM saga.inbox
    WHERE received_at < now() - make_interval(secs => $1)
    ORDER BY received_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM saga.inbox AS inbox USING old
    WHERE inbox.consumer = old.consumer AND inbox.message_id = old.message_id
    RETURNING 1
)
SELECT count(*) FROM gone
"""


async def prune_inbox(pool: asyncpg.Pool, retention_s: float, batch: int = PRUNE_BATCH) -> int:
    """Delete the inbox rows received more than ``retention_s`` ago, a batch per transaction; how many."""
    pruned = 0
    while True:
        deleted = int(await pool.fetchval(_PRUNE_SQL, retention_s, batch))
        pruned += deleted
        if deleted < batch:
            return pruned
        await asyncio.sleep(0)  # let the service's own work in between batches


class InboxPruner:
    """Prunes the inbox every ``every_s`` (the first time at start) until stopped; errors are logged and
    retried at the next round, never fatal."""

    def __init__(self, pool: asyncpg.Pool, retention_s: float, every_s: float = PRUNE_EVERY_S) -> None:
        self._pool = pool
        self._retention_s = retention_s
        self._every_s = every_s
        self.pruned = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Prune, sleep, repeat, until ``stop`` is set."""
        while not stop.is_set():
            try:
                pruned = await prune_inbox(self._pool, self._retention_s)
            except Exception as error:  # a database outage: the next round tries again
                log.warning("inbox pruning failed, retrying later",
                            extra={"error": repr(error), "retry_in_s": self._every_s})
            else:
                self.pruned += pruned
                if pruned:
                    log.info("inbox pruned", extra={"rows": pruned, "older_than_h": self._retention_s / 3600})
            await sleep_or_stop(stop, self._every_s)
