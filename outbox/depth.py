"""How far an outbox is behind: the rows waiting, how long the oldest due one has waited, the rows parked.

The service that writes an outbox refreshes these gauges from a chore every ``SIGNALS_EVERY_S`` (never per
scrape and never on the path of a message): one statement per table, a scan of a queue table that holds
only what the relay has not published yet, under a statement timeout. An outbox that stops draining shows as
``saga_outbox_oldest_age_seconds`` growing while ``saga_relay_rows_published_total`` stands still.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import asyncpg

from ..infra.chores import Chore
from ..infra.db import check_table
from ..infra.health import ServiceHealth
from .table import parked_table

log = logging.getLogger(__name__)

SIGNALS_EVERY_S = 5.0
"""How often a service refreshes the gauges it reads from its tables."""
SIGNALS_TIMEOUT_S = 2.0
"""A refresh that takes longer gives up: the gauges keep their last values until the next one."""


@dataclass(frozen=True)
class OutboxDepth:
    """One outbox table as a refresh found it."""

    rows: int  # not yet published, held-back ones (available_at in the future) included
    oldest_due_age_s: float  # how long the oldest row that is due has waited; 0 when none is due
    parked: int


async def outbox_depth(pool: asyncpg.Pool, table: str) -> OutboxDepth:
    """``table``'s depth now (one statement)."""
    row = await pool.fetchrow(
        f"""SELECT (SELECT count(*) FROM {check_table(table)}) AS rows,
                   (SELECT coalesce(extract(epoch FROM now() - min(available_at)), 0)
                      FROM {table} WHERE available_at <= now()) AS oldest_due_age_s,
                   (SELECT count(*) FROM {parked_table(table)}) AS parked""",
        timeout=SIGNALS_TIMEOUT_S)
    assert row is not None
    return OutboxDepth(int(row["rows"]), max(0.0, float(row["oldest_due_age_s"])), int(row["parked"]))


async def refresh_outbox_gauges(pool: asyncpg.Pool, tables: Sequence[str], health: ServiceHealth) -> None:
    """Set ``saga_outbox_rows``, ``saga_outbox_oldest_age_seconds`` and ``saga_outbox_parked_rows`` of
    ``tables``; raises what the database raised (the gauges keep their values)."""
    for table in tables:
        depth = await outbox_depth(pool, table)
        health.outbox_rows.labels(table=table).set(depth.rows)
        health.outbox_oldest_age.labels(table=table).set(depth.oldest_due_age_s)
        health.outbox_parked_rows.labels(table=table).set(depth.parked)


def quiet_refresh(name: str, refresh: Callable[[], Awaitable[None]],
                  every_s: float = SIGNALS_EVERY_S) -> Chore:
    """A chore running ``refresh`` every ``every_s``. A failure (Postgres away, the timeout) is logged at DEBUG
    only: the service's probes already report an outage, and a line every few seconds would drown it."""

    async def work() -> int:
        try:
            await refresh()
        except Exception as error:
            log.debug("gauge refresh failed", extra={"chore": name, "error": repr(error)})
        return 0

    return Chore(name, work, every_s)


def outbox_gauges(pool: asyncpg.Pool, tables: Sequence[str], health: ServiceHealth,
                  every_s: float = SIGNALS_EVERY_S) -> Chore:
    """The chore refreshing the outbox gauges of ``tables`` every ``every_s``."""
    return quiet_refresh("outbox gauges", lambda: refresh_outbox_gauges(pool, tables, health), every_s)
