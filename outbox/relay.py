"""Outbox relay: publishes committed outbox rows to Kafka, then deletes them.

Delivery is at-least-once. The relay deletes rows only after Kafka acknowledged every record of the batch
(acks=all); a crash or error between the acknowledgement and the DELETE leaves the rows in place, and they
are published again later with the same ``message_id`` header. Every consumer dedupes on that header. How a
batch is handed to Kafka (one record batch per partition, every ack awaited, its spans): ``outbox.publishing``.

Order: rows are read in id order and sent in that order through one idempotent producer, so records with
the same key (same partition) reach Kafka in id order. Ids follow commit order for one key as long as one
key's rows are written by transactions that commit one after another — true for a saga, whose event-store
primary key serialises its writers. A row whose ``available_at`` is in the future is deliberately held back
and may be overtaken by later rows of its key.

Only one relay publishes a shard of the table at a time: it holds the shard's lease (``outbox.lease``: an
expiring row with a fencing epoch, and an advisory lock on a connection it keeps for the fast hand-over when
its process dies); others stand by and retry. A relay publishes the shards ``shards`` names (every
orchestrator instance its own partitions; a participant's relay shard 0, all its rows); a shard it no longer
wants it gives back between passes. A relay that cannot renew its leases in time stops handing records to
Kafka before a standby may take them over.

A batch Kafka refuses for a reason of its records (``infra.failures``: a record over the topic's limit, a topic
it refuses or lacks) goes down the isolation ladder (``infra.isolation``): each key's rows alone, then each row
alone ``poison_attempts`` times, then the row is parked: moved to ``<table>_parked`` with the reason, and the
later rows of its key (its saga) wait behind it in the outbox, their order kept, while every other key's rows
go on. A platform fault (the broker or Postgres away) parks nothing: the relay backs off and tries the same rows
again. ``saga outbox`` lists, requeues and discards parked rows; a requeued row keeps its id and so goes first
again.

Wake-up: a writer in the same process calls ``wake`` after its commit; otherwise a short adaptive poll
(``min_poll_ms`` while polls keep finding rows, doubling to ``max_poll_ms`` when idle, none at all while
batches are full; rows a wake-up brought leave the interval as it was) finds the rows, instead of
LISTEN/NOTIFY, whose NOTIFY in every writing transaction serialises commits on a global lock.
``bench/relay.py`` measures both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Hashable, Sequence
from enum import StrEnum
from typing import Any

import asyncpg
import orjson
from aiokafka.errors import KafkaError
from opentelemetry.trace import SpanKind

from ..infra import tracing
from ..infra.db import check_table
from ..infra.failures import PlatformUnavailable, describe
from ..infra.faults import crash_point
from ..infra.health import current as current_health
from ..infra.isolation import IsolationLadder, OutageWait
from ..infra.kafka_clients import KafkaClients
from ..infra.logging import saga_trace
from ..infra.startup import sleep_or_stop, sleep_or_woken
from ..schemas.headers import TRACEPARENT
from .lease import KEEPALIVE_SETTINGS, STATEMENT_TIMEOUT_S, ShardLeases, leases_table
from .publishing import BatchFailed, ProducerFactory, default_producer_factory, publish, row_saga_id, trace_publish
from .table import parked_table

log = logging.getLogger(__name__)

WOKEN_MAX_POLL_MS = 1000
"""Longest idle wait of a relay whose writers wake it after each commit (in their process): its polls only find
rows of writers elsewhere (another replica) or held-back rows, whose due time it asks for."""
MIN_POLL_MS = 5  # default wait between polls while they keep finding rows
MAX_POLL_MS = 50  # default wait between polls once they stop finding rows


ONE_SHARD: tuple[int, ...] = (0,)
"""The shards of a table whose writers do not shard it (a participant's outbox): every row is in shard 0."""


class OutboxRelay:
    """Publishes one outbox table; ``run`` until stopped, or ``publish_once`` step by step in tests."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        table: str,
        kafka: KafkaClients | None = None,
        *,
        producer_factory: ProducerFactory | None = None,
        shards: Callable[[], Collection[int] | None] = lambda: ONE_SHARD,
        batch_size: int = 500,
        min_poll_ms: float = MIN_POLL_MS,
        max_poll_ms: float = MAX_POLL_MS,
        standby_retry_ms: float = 1000,
        max_backoff_ms: float = 5000,
        poison_attempts: int = 3,
    ) -> None:
        if producer_factory is None:
            if kafka is None:
                raise ValueError("give kafka or producer_factory")
            producer_factory = default_producer_factory(kafka)
        self.table = check_table(table)
        self._pool = pool
        self._producer_factory = producer_factory
        self._batch_size = batch_size
        self._min_poll_s = min_poll_ms / 1000
        self._max_poll_s = max_poll_ms / 1000
        self._standby_retry_s = standby_retry_ms / 1000
        self._max_backoff_s = max_backoff_ms / 1000
        self._shards = shards
        self._leases = ShardLeases(self.table, retry_every_s=self._standby_retry_s)
        self._conn: asyncpg.Connection | None = None  # holds the shards' advisory locks while not None
        self._producer: Any = None
        self.parked_table = parked_table(table)
        # Rows only of shards whose lease still names this holder and epoch (the fencing), joined with a table
        # of a few rows; the anti-join with one that is nearly always empty: a hash of nothing, next to no cost.
        # The leases are read once per pass (an InitPlan), so the outbox is still read in id order from its
        # primary key, stopping at the batch size, past the dead rows a queue table is full of.
        self._select_sql = (
            f"SELECT id, topic, message_key, value, headers::text AS headers, message_id FROM {table} o"
            f" WHERE shard = ANY(ARRAY(SELECT l.shard FROM {leases_table(table)} l"
            " WHERE l.holder = $2 AND l.expires_at > now()"
            " AND (l.shard, l.epoch) IN (SELECT * FROM unnest($3::int[], $4::bigint[]))))"
            f" AND available_at <= now() AND NOT EXISTS (SELECT 1 FROM {self.parked_table} p"
            " WHERE p.message_key = o.message_key) ORDER BY id LIMIT $1"
        )
        self._delete_sql = f"DELETE FROM {table} WHERE id = ANY($1::bigint[])"
        self._held_back_sql = (f"SELECT extract(epoch FROM min(available_at) - now()) FROM {table}"
                               " WHERE available_at > now() AND shard = ANY($1::int[])")
        # After a batch that did not fill, the delete also asks when the next held-back row is due: one round
        # trip instead of two. Both parts read one snapshot; the deleted rows were due, so never counted.
        self._delete_asking_sql = (f"WITH published AS (DELETE FROM {table} WHERE id = ANY($2::bigint[]))"
                                   f" {self._held_back_sql}")
        self._held_back_answer: tuple[float | None] | None = None  # this pass's answer, when its delete asked
        self._park_sql = (
            f"WITH moved AS (DELETE FROM {table} WHERE id = $1 RETURNING *)"
            f" INSERT INTO {self.parked_table} (id, topic, message_key, value, headers, message_id, available_at,"
            " created_at, shard, reason) SELECT id, topic, message_key, value, headers, message_id, available_at,"
            " created_at, shard, $2 FROM moved"
        )
        self._rows = IsolationLadder(_OutboxRows(self), f"relay {table}", poison_attempts, span="outbox.publish",
                                     span_kind=SpanKind.PRODUCER)
        self._outage = OutageWait(f"relay {table}", max_s=self._max_backoff_s)
        self._pass_rows = 0  # rows the current pass read
        self._parked_keys: set[str] = set()  # keys with a row parked in this pass: their later rows wait
        self.parked_total = 0
        self.published_total = 0
        self._wakeup = asyncio.Event()

    @property
    def is_active(self) -> bool:
        """True while this relay holds, and trusts, the lease of at least one shard."""
        return self._conn is not None and self._leases.trusted()

    @property
    def shards(self) -> list[int]:
        """The shards whose leases this relay holds."""
        return self._leases.shards

    async def publish_once(self) -> int:
        """Take the lock if free, publish one batch of due rows, delete them; return the rows published
        (0 when standing by or when nothing is due). Errors propagate; ``run`` handles them."""
        if not await self._ensure_active(retry_now=True):
            return 0
        return await self._publish_batch(await self._ensure_producer())

    async def run(self, stop: asyncio.Event) -> None:
        """Publish until ``stop`` is set, surviving Kafka and Postgres outages with backoff; then close."""
        idle_s = self._min_poll_s
        woken = False
        try:
            while not stop.is_set():
                try:
                    if not await self._ensure_active():
                        await sleep_or_stop(stop, self._standby_retry_s)
                        continue
                    published = await self._publish_batch(await self._ensure_producer())
                except Exception as exc:  # a platform fault (or the park failed): back off, the rows stay
                    await self._after_error(exc)
                    await self._outage.pause(exc, stop, table=self.table, shards=self._leases.shards,
                                             **(exc.fields() if isinstance(exc, BatchFailed) else {}))
                    continue
                self._outage.over()
                if published >= self._batch_size:
                    continue  # more is waiting: no sleep
                idle_s = self._next_poll_s(idle_s, published, woken)
                woken = await self._nap(stop, await self._until_held_back(idle_s))
        finally:
            await self.close()

    def wake(self) -> None:
        """Rows were just committed: publish them now rather than at the next poll (a writer in this
        process calls it after its commit; writers elsewhere are found by polling)."""
        self._wakeup.set()

    def _next_poll_s(self, idle_s: float, published: int, woken: bool) -> float:
        """The wait before the next poll: ``min_poll_ms`` after a poll found rows, doubling after one that
        found none. Rows found because a writer woke us say nothing about rows the poll is there for (those
        of writers that cannot wake us), so they leave the interval as it was."""
        if not published:
            return min(idle_s * 2, self._max_poll_s)
        return idle_s if woken else self._min_poll_s

    async def _until_held_back(self, idle_s: float) -> float:
        """``idle_s``, or less when a row held back (``available_at``) comes due sooner: it is published on
        time without a short poll. Asked only after a poll that did not fill a batch (by its delete, when it
        found rows)."""
        answer, self._held_back_answer = self._held_back_answer, None
        if self._conn is None or idle_s <= self._min_poll_s:
            return idle_s
        try:
            wait_s = answer[0] if answer is not None else await self._conn.fetchval(
                self._held_back_sql, self._leases.shards, timeout=STATEMENT_TIMEOUT_S)
        except Exception as error:  # the connection is gone: the next poll fails too, and reconnects
            log.debug("could not read when held-back rows are due", extra={"table": self.table, "error": repr(error)})
            return idle_s
        return idle_s if wait_s is None else max(0.0, min(idle_s, float(wait_s)))

    async def _nap(self, stop: asyncio.Event, seconds: float) -> bool:
        """Sleep until the next poll, a ``wake`` or ``stop``, whichever comes first; True when woken."""
        woken = await sleep_or_woken(stop, self._wakeup, seconds)
        self._wakeup.clear()
        return woken

    async def close(self) -> None:
        """Stop the producer and give the lock (and its connection) back."""
        await self._drop_producer()
        await self._drop_connection()

    async def _ensure_active(self, retry_now: bool = False) -> bool:
        """Renew, give back or take shard leases when due (``retry_now``: try for missing shards now); True
        when this relay may publish now."""
        wanted = self._shards() or ()
        if self._conn is None:
            if not wanted:
                return False
            conn = await self._pool.acquire(timeout=STATEMENT_TIMEOUT_S)
            try:
                await conn.execute("SELECT " + ", ".join(f"set_config('{name}', '{value}', false)"
                                                         for name, value in KEEPALIVE_SETTINGS.items()),
                                   timeout=STATEMENT_TIMEOUT_S)
            except BaseException:
                await self._pool.release(conn)
                raise
            self._conn = conn
        if self._leases.due(wanted) or (retry_now and set(wanted) != set(self._leases.epochs)):
            was_active = bool(self._leases.epochs)
            await self._leases.refresh(self._conn, wanted, STATEMENT_TIMEOUT_S)
            if bool(self._leases.epochs) != was_active:
                log.info("outbox relay active" if self._leases.epochs else "outbox relay standing by",
                         extra={"table": self.table, "shards": self._leases.shards})
        return self._leases.trusted()

    def _check_trust(self) -> None:
        """Raise _NotTrusted when this relay's leases may have passed to a standby: hand nothing to Kafka."""
        if not self._leases.trusted():
            raise _NotTrusted(f"the leases of {self.table} were not renewed in time: publishing nothing until they are")

    async def _ensure_producer(self) -> Any:
        if self._producer is None:
            producer = self._producer_factory()
            try:
                await producer.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    await producer.stop()
                raise
            self._producer = producer
        return self._producer

    async def _publish_batch(self, producer: Any) -> int:
        """One pass: read up to a batch of due rows, publish them (down the isolation ladder when that fails for
        a reason of some rows), delete what was published; how many were. Raises a platform fault."""
        assert self._conn is not None
        self._held_back_answer = None
        shards = self._leases.shards
        rows = await self._conn.fetch(self._select_sql, self._batch_size, self._leases.holder, shards,
                                      [self._leases.epochs[shard] for shard in shards], timeout=STATEMENT_TIMEOUT_S)
        if not rows:
            return 0
        self._pass_rows, self._parked_keys = len(rows), set()
        fates = await self._rows.run(rows)
        log.debug("outbox batch published", extra={"table": self.table, "rows": len(rows)})
        return fates.count(_Fate.PUBLISHED)

    async def _publish_rows(self, rows: Sequence[asyncpg.Record]) -> list[_Fate]:
        """Publish ``rows`` (but those behind a row parked in this pass) and delete them once Kafka acknowledged
        them all; ``BatchFailed`` when Kafka did not."""
        sending = [row for row in rows if row["message_key"] not in self._parked_keys]
        if sending:
            self._check_trust()
            producer = await self._ensure_producer()
            if tracing.tracer is not None:
                trace_publish(self.table, sending)  # the unit's spans: the ladder ends them, with any failure
            try:
                await publish(producer, sending)
            except BatchFailed:
                # A refused batch may leave the idempotent producer's sequence of that partition broken.
                await self._drop_producer()
                raise
            crash_point("relay.after_publish")  # acknowledged by Kafka, still in the outbox: published again
            await self._published(sending, ask_held_back=len(rows) == self._pass_rows < self._batch_size)
        return [_Fate.WAITING if row["message_key"] in self._parked_keys else _Fate.PUBLISHED for row in rows]

    async def _published(self, rows: list[asyncpg.Record], ask_held_back: bool = False) -> None:
        """Delete the published ``rows``; with ``ask_held_back``, keep when the next held-back row is due for
        this pass's ``_until_held_back``."""
        assert self._conn is not None
        ids = [row["id"] for row in rows]
        if ask_held_back:
            self._held_back_answer = (await self._conn.fetchval(self._delete_asking_sql, self._leases.shards, ids,
                                                                timeout=STATEMENT_TIMEOUT_S),)
        else:
            await self._conn.execute(self._delete_sql, ids, timeout=STATEMENT_TIMEOUT_S)
        self.published_total += len(rows)
        current_health().published(self.table, len(rows))

    async def _park(self, row: asyncpg.Record, cause: BaseException) -> _Fate:
        """Move ``row`` aside with the reason Kafka refused it; the later rows of its key wait behind it."""
        assert self._conn is not None
        if isinstance(cause, BatchFailed):
            cause = cause.cause
        reason = f"refused every time: {describe(cause)}"[:2000]
        await self._conn.execute(self._park_sql, row["id"], reason, timeout=STATEMENT_TIMEOUT_S)
        self._parked_keys.add(row["message_key"])
        self.parked_total += 1
        current_health().parked(self.table, 1)
        with saga_trace(orjson.loads(row["headers"]).get(TRACEPARENT)):
            log.error("outbox row parked; the later rows of its key wait behind it", extra={
                "table": self.table, "id": row["id"], "topic": row["topic"], "key": row["message_key"],
                "saga_id": row_saga_id(row), "message_id": row["message_id"], "bytes": len(row["value"]),
                "reason": reason})
        return _Fate.PARKED

    async def _after_error(self, exc: Exception) -> None:
        """Let go of what ``exc`` may have broken before the pass is tried again."""
        if isinstance(exc, _NotTrusted):
            return  # nothing broke: the next pass renews the leases first
        cause = exc.cause if isinstance(exc, BatchFailed) else exc
        if isinstance(cause, KafkaError):
            # A producer whose idempotent sequence broke must be recreated; the lock connection is fine.
            await self._drop_producer()
        else:
            await self._drop_connection()

    async def _drop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                await producer.stop()
            except Exception as exc:
                log.warning("kafka producer stop failed", extra={"table": self.table, "error": repr(exc)})

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        held = set(self._leases.shards) | self._leases.locked
        try:
            # The pool does not reset released connections, so the leases and locks are given back here.
            if held:
                await self._leases.give_back(conn, held, STATEMENT_TIMEOUT_S)
        except Exception as exc:
            # Either the session is dead (and its lock gone with it) or its state is unknown: end it rather
            # than pool a connection that may still hold the lock.
            log.warning("relay connection dropped", extra={"table": self.table, "error": repr(exc)})
            with contextlib.suppress(Exception):  # a dead one is already back in the pool
                conn.terminate()
        else:
            try:
                await self._pool.release(conn, timeout=5)
            except Exception as exc:  # the pool terminates a connection it could not take back
                log.warning("relay connection release failed", extra={"table": self.table, "error": repr(exc)})
        finally:
            self._leases.forget()
        log.info("outbox relay inactive", extra={"table": self.table})


class _NotTrusted(PlatformUnavailable):
    """The relay's leases were not renewed within their trust: a standby may hold them soon. Publishing nothing
    until they are is waiting for the platform (the lease connection), never a fault of the rows."""


class _Fate(StrEnum):
    """What became of an outbox row in a pass."""

    PUBLISHED = "published"
    PARKED = "parked"
    WAITING = "waiting"  # behind a row of its key parked in this pass


class _OutboxRows:
    """A relay's rows on the isolation ladder: grouped by Kafka key, parked at its end."""

    def __init__(self, relay: OutboxRelay) -> None:
        self._relay = relay

    def group_of(self, row: asyncpg.Record) -> Hashable:
        key: str = row["message_key"]
        return key

    async def handle(self, rows: Sequence[asyncpg.Record]) -> list[_Fate]:
        return await self._relay._publish_rows(rows)

    async def isolate(self, row: asyncpg.Record, error: Exception) -> _Fate:
        return await self._relay._park(row, error)


