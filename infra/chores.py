"""Housekeeping chores a service runs beside its work: prune a table, apply a retention policy."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import asyncpg

from .startup import sleep_or_stop

log = logging.getLogger("saga.housekeeping")

CHORE_EVERY_S = 600.0
DELETE_BATCH = 5_000


def delete_older_sql(table: str, keys: Sequence[str], stamped: str, also: str = "") -> str:
    """A statement for ``delete_older_than``: deletes up to ``$2`` rows of ``table`` whose ``stamped`` column is
    more than ``$1`` seconds old (and for which the SQL condition ``also`` holds), oldest first, and returns how
    many. ``keys`` identify a row. SKIP LOCKED: two services pruning at once do not wait on each other."""
    matched = " AND ".join(f"t.{key} = old.{key}" for key in keys)
    return f"""
WITH old AS (
    SELECT {", ".join(keys)} FROM {table}
    WHERE {stamped} < now() - make_interval(secs => $1){f" AND {also}" if also else ""}
    ORDER BY {stamped}
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {table} AS t USING old WHERE {matched} RETURNING 1
)
SELECT count(*) FROM gone
"""


async def delete_older_than(pool: asyncpg.Pool, sql: str, age_s: float, batch: int = DELETE_BATCH) -> int:
    """Run a ``delete_older_sql`` statement until it deletes fewer than ``batch`` rows: one short transaction
    per batch (short locks); the total."""
    deleted = 0
    while True:
        count = int(await pool.fetchval(sql, age_s, batch))
        deleted += count
        if count < batch:
            return deleted
        await asyncio.sleep(0)  # let the service's own work in between batches


class Chore:
    """Runs ``work`` (which returns how many things it did) every ``every_s``, the first time at start, until
    stopped. A failure (a database outage) is logged and tried again at the next round, never fatal.
    ``next_round_s``, when given, says after a round that succeeded how long to wait for the next one instead
    (a chore that knows when its next work is due)."""

    def __init__(self, name: str, work: Callable[[], Awaitable[int]], every_s: float = CHORE_EVERY_S,
                 next_round_s: Callable[[], float] | None = None, **log_fields: object) -> None:
        self.name = name
        self.done = 0
        self._work = work
        self._every_s = every_s
        self._next_round_s = next_round_s
        self._log_fields = log_fields

    async def run(self, stop: asyncio.Event) -> None:
        """Work, sleep, repeat, until ``stop`` is set."""
        while not stop.is_set():
            wait_s = self._every_s
            try:
                done = await self._work()
            except Exception as error:
                log.warning("housekeeping failed, retrying later",
                            extra={"chore": self.name, "error": repr(error), "retry_in_s": self._every_s,
                                   **self._log_fields})
            else:
                self.done += done
                if done:
                    log.info("housekeeping done", extra={"chore": self.name, "count": done, **self._log_fields})
                if self._next_round_s is not None:
                    wait_s = self._next_round_s()
            await sleep_or_stop(stop, wait_s)
