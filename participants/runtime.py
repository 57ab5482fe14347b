"""The Postgres side of a participant worker: its pool, tables and outbox relay, and the batch handler
that rides out Postgres outages. Framework-free: the faust worker (``participants.runner``) drives it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import asyncpg

from ..infra.db import create_pool
from ..infra.health import current as current_health
from ..infra.settings import Settings
from ..outbox.relay import WOKEN_MAX_POLL_MS, OutboxRelay
from ..schemas.headers import SAGA_ID
from ..schemas.records import ConsumedRecord
from ..schemas.topics import Topics
from .kit.ddl import ensure_participant_schema
from .kit.handling import Disposition, dead_letter_poisoned, handle_commands, unavailable
from .kit.ledger import record_pruner
from .kit.participant import Participant

log = logging.getLogger("participants.runner")

# Postgres outages are ridden out by retrying the same (unacknowledged) delivery with this backoff.
_RETRY_FIRST_S = 0.1
_RETRY_MAX_S = 5.0
# The worker's own commits wake its relay; the poll only finds rows another replica of the participant
# wrote (replies whose delay is over it asks for), so it can be slow and cost little.
RELAY_MIN_POLL_MS = 25
RELAY_MAX_POLL_MS = WOKEN_MAX_POLL_MS


class DeliveryAbandoned(Exception):
    """The worker is stopping and Postgres is unavailable: the delivery stays unacknowledged."""


class ParticipantRuntime:
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
                                    shards=lambda: self.owned_partitions)
                self._relay = relay
                name = self.participant.name
                self._tasks.append(asyncio.create_task(relay.run(self._tasks_stop), name=f"outbox-relay-{name}"))
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

    async def _handle(self, pool: asyncpg.Pool, batch: Sequence[ConsumedRecord]) -> list[Disposition]:
        try:
            return await handle_commands(pool, self.participant, self.topics, batch)
        except Exception as exc:
            if unavailable(exc) or (len(batch) == 1 and self.settings.saga_poison_attempts == 1):
                raise
            log.warning("command batch failed, handling its commands one at a time",
                        extra={"participant": self.participant.name, "commands": len(batch), "error": repr(exc)})
        return [await self._alone(pool, record) for record in batch]

    async def _alone(self, pool: asyncpg.Pool, record: ConsumedRecord) -> Disposition:
        error: Exception | None = None
        for _ in range(self.settings.saga_poison_attempts):
            try:
                [disposition] = await handle_commands(pool, self.participant, self.topics, [record])
                return disposition
            except Exception as exc:
                if unavailable(exc):
                    raise
                error = exc
        assert error is not None
        log.error("command failed every time, dead-lettering it",
                  extra={"participant": self.participant.name, "saga_id": record.header(SAGA_ID),
                         "topic": record.topic, "partition": record.partition, "offset": record.offset,
                         "attempts": self.settings.saga_poison_attempts, "error": repr(error)})
        return await dead_letter_poisoned(pool, self.participant, self.topics, record, error)

    async def process_batch(self, batch: Sequence[ConsumedRecord]) -> list[Disposition]:
        """Handle deliveries in one transaction, retrying the whole batch while Postgres is unavailable (their
        offsets stay unacknowledged). A batch that fails for another reason is handled a delivery at a time,
        and a delivery that fails ``saga_poison_attempts`` times on its own is dead-lettered: one command's
        problem never stops the others."""
        delay = _RETRY_FIRST_S
        while True:
            try:
                pool = await self.start()  # inside the try: Postgres may be away when the pool opens
                dispositions = await self._handle(pool, batch)
                health = current_health()
                health.handled(len(batch))
                health.commands_handled(self.participant.name, dispositions)
                health.dead_lettered(dispositions.count(Disposition.DEAD_LETTERED))
                self._replies_committed()
                return dispositions
            except Exception as exc:
                if self.stopping or self._should_stop():
                    # Give up without acknowledging: the next owner of the partition gets it again.
                    # Retrying here would hold the worker's shutdown hostage to Postgres.
                    raise DeliveryAbandoned(repr(exc)) from exc
                first = batch[0]
                log.warning(
                    "command not handled, retrying",
                    extra={"participant": self.participant.name, "topic": first.topic, "commands": len(batch),
                           "partition": first.partition, "offset": first.offset, "retry_in_s": delay,
                           "error": repr(exc)},
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_S)
