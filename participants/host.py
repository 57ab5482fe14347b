"""What hosts one participant in a worker: its pool, tables and outbox relay, and the handling of each batch of
its commands (down the isolation ladder, a platform fault waited out). Framework-free: the faust worker
(``participants.runner``) drives one host per participant it runs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Sequence

import asyncpg
from opentelemetry.trace import SpanKind

from ..infra.db import create_pool
from ..infra.health import current as current_health
from ..infra.isolation import IsolationLadder, OutageWait
from ..infra.settings import Settings
from ..outbox.depth import outbox_gauges
from ..outbox.relay import WOKEN_MAX_POLL_MS, OutboxRelay
from ..schemas.records import ConsumedRecord
from ..schemas.topics import Topics
from .kit.ddl import ensure_participant_schema
from .kit.deferred import answer_timeouts
from .kit.handling import Disposition, dead_letter_poisoned, handle_commands
from .kit.ledger import record_pruner
from .kit.participant import Participant

log = logging.getLogger("participants.runner")

# Platform faults are waited out by handing the same (unacknowledged) deliveries over again, backing off to this.
_RETRY_MAX_S = 5.0
# The worker's own commits wake its relay; the poll only finds rows another replica of the participant
# wrote (replies whose delay is over it asks for), so it can be slow and cost little.
RELAY_MIN_POLL_MS = 25
RELAY_MAX_POLL_MS = WOKEN_MAX_POLL_MS


class DeliveryAbandoned(Exception):
    """The worker is stopping and Postgres is unavailable: the delivery stays unacknowledged."""


class ParticipantHost:
    """The Postgres pool, schema and outbox relay of one worker, living on the worker's event loop.

    Faust starts agents before app tasks, so the agent itself waits for :meth:`start` (idempotent).
    """

    def __init__(
        self, participant: Participant, settings: Settings, *, should_stop: Callable[[], bool] | None = None
    ) -> None:
        self.participant = participant
        self.settings = settings
        self.topics = Topics(settings.saga_topic_prefix)
        self.stopping = False
        self._should_stop = should_stop or (lambda: False)
        self._pool: asyncpg.Pool | None = None
        self._start_lock: asyncio.Lock | None = None
        self._tasks_stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []  # the outbox relay and the housekeeping
        self._relay: OutboxRelay | None = None
        self._commands = IsolationLadder(_Commands(self), f"participant {participant.name}",
                                         settings.saga_poison_attempts, span="participant.handle",
                                         span_kind=SpanKind.CONSUMER)
        self._outage = OutageWait(f"participant {participant.name}", max_s=_RETRY_MAX_S)
        # The partitions of its commands topic this worker owns (set by the worker as faust assigns them): its
        # relay publishes the outbox shards of those, the replies to the commands it handled.
        self.owned_partitions: frozenset[int] | None = None

    async def start(self) -> asyncpg.Pool:
        """Open the pool, create the participant's tables and start its outbox relay (once)."""
        if self._pool is not None:
            return self._pool
        if self.stopping:
            raise RuntimeError(f"participant {self.participant.name} is stopping")
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._pool is None:
                # +1: the relay keeps one connection for its shards' leases.
                pool = await create_pool(self.settings.dsn(), self.settings.saga_db_pool_size + 1,
                                         application_name=f"saga-{self.participant.name}")
                try:
                    await ensure_participant_schema(pool, self.participant)
                except BaseException:
                    await pool.close()  # the next call opens a new one
                    raise
                relay = OutboxRelay(pool, self.participant.outbox_table, self.settings.kafka(),
                                    min_poll_ms=RELAY_MIN_POLL_MS, max_poll_ms=RELAY_MAX_POLL_MS,
                                    shards=lambda: self.owned_partitions,
                                    poison_attempts=self.settings.saga_poison_attempts)
                self._relay = relay
                name = self.participant.name
                self._tasks.append(asyncio.create_task(relay.run(self._tasks_stop), name=f"outbox-relay-{name}"))
                depth = outbox_gauges(pool, [self.participant.outbox_table], current_health())
                self._tasks.append(asyncio.create_task(depth.run(self._tasks_stop), name=f"outbox-gauges-{name}"))
                overdue = answer_timeouts(pool, self.participant, self.topics)
                self._tasks.append(asyncio.create_task(overdue.run(self._tasks_stop), name=f"answer-timeouts-{name}"))
                if retention_h := self.settings.saga_participant_retention_hours:
                    pruner = record_pruner(pool, self.participant.schema, retention_h * 3600)
                    self._tasks.append(asyncio.create_task(pruner.run(self._tasks_stop), name=f"pruner-{name}"))
                self._pool = pool
                log.info("participant started", extra={"participant": self.participant.name})
        return self._pool

    async def stop(self) -> None:
        """Stop the relay (it flushes nothing more) and the housekeeping, and close the pool; safe to call
        twice."""
        self.stopping = True
        self._tasks_stop.set()
        tasks, self._tasks = self._tasks, []
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()
        log.info("participant stopped", extra={"participant": self.participant.name})

    def _replies_committed(self) -> None:
        # The replies are in the outbox: the relay publishes them now instead of at its next poll.
        if self._relay is not None:
            self._relay.wake()

    async def process_batch(self, batch: Sequence[ConsumedRecord]) -> list[Disposition]:
        """Handle deliveries in one transaction. A batch that fails goes down the isolation ladder (each saga's
        commands alone, then each command alone ``saga_poison_attempts`` times, then it is dead-lettered and
        answered ``Unprocessable``): one command's problem never stops the others. A platform fault (Postgres
        away, out of disk or connections) is waited out with backoff and the batch handed over again, its
        offsets unacknowledged meanwhile."""
        while True:
            try:
                await self.start()  # inside the try: Postgres may be away when the pool opens
                dispositions = await self._commands.run(batch)
            except Exception as exc:
                if self.stopping or self._should_stop():
                    # Give up without acknowledging: the next owner of the partition gets it again.
                    # Retrying here would hold the worker's shutdown hostage to Postgres.
                    raise DeliveryAbandoned(repr(exc)) from exc
                first = batch[0]
                await self._outage.pause(exc, participant=self.participant.name, topic=first.topic,
                                         commands=len(batch), partition=first.partition, offset=first.offset)
                continue
            self._outage.over()
            health = current_health()
            health.handled(len(batch))
            health.commands_handled(self.participant.name, dispositions)
            health.dead_lettered(dispositions.count(Disposition.DEAD_LETTERED))
            self._replies_committed()
            return dispositions


class _Commands:
    """A worker's commands on the isolation ladder: grouped by saga (their Kafka key), dead-lettered and answered
    ``Unprocessable`` at its end."""

    def __init__(self, host: ParticipantHost) -> None:
        self._host = host

    def group_of(self, record: ConsumedRecord) -> Hashable:
        return record.key

    async def handle(self, records: Sequence[ConsumedRecord]) -> list[Disposition]:
        host = self._host
        return await handle_commands(await host.start(), host.participant, host.topics, records)

    async def isolate(self, record: ConsumedRecord, error: Exception) -> Disposition:
        host = self._host
        return await dead_letter_poisoned(await host.start(), host.participant, host.topics, record, error)
