"""The orchestrator's one pipeline: messages → inbox → load → fold → decide → rows, in transactions.

Every consumed record arrives as a message (``inbound``): a record that is no acceptable message too, as a
RejectedRecord the core decides like any other, and every due timer. One message, or a batch of messages of
many sagas, per transaction: a batch costs the same few statements as one message (claim all, load all, then
one write), which is where the throughput comes from.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from enum import StrEnum
from typing import TypeVar

from ..schemas import wire
from ..schemas.message_types import StartSaga
from ..schemas.topics import Topics
from .domain.decide import decide
from .domain.definition import DefinitionRegistry, SagaDefinition
from .domain.messages import RejectedRecord
from .domain.state import SagaState, SagaStatus, apply_event
from .inbound import Envelope, timer_envelope
from .observe import log_decision
from .outbound import PendingWrites, Settled
from .ports import ConcurrencyConflict, InboxKey, StoredEvent, UnitOfWork, UnitOfWorkFactory

log = logging.getLogger("saga.orchestrator")

CONSUMER_NAME = "orchestrator"
MAX_CONFLICT_RETRIES = 8
STATE_CACHE_SIZE = 20_000

T = TypeVar("T")


class Outcome(StrEnum):
    """What handling one message amounted to."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    NOTHING_TO_DO = "nothing_to_do"
    DEAD_LETTERED = "dead_lettered"


class SagaService:
    """The orchestrator's application service; every decision comes from the fold of the saga's events.

    Folded states are cached per saga, but each transaction still reads the events recorded after the
    cached one, so a stale cache costs a read, never a wrong decision.
    """

    def __init__(self, units: UnitOfWorkFactory, definitions: DefinitionRegistry, topics: Topics,
                 clock_ms: Callable[[], int], consumer_name: str = CONSUMER_NAME,
                 on_commit: Callable[[], None] | None = None,
                 on_settled: Callable[[Settled], None] | None = None) -> None:
        self._units = units
        self._definitions = definitions
        self._topics = topics
        self._clock_ms = clock_ms
        self._consumer = consumer_name
        self._cache: OrderedDict[str, SagaState] = OrderedDict()
        self._on_commit = on_commit  # e.g. an in-process outbox relay's wake()
        self._on_settled = on_settled  # e.g. metrics of what the committed decisions did

    async def handle(self, envelope: Envelope) -> Outcome:
        """Apply one message exactly once in effect; retried on an optimistic-concurrency conflict."""
        return (await self.handle_many([envelope]))[0]

    async def handle_many(self, envelopes: Sequence[Envelope]) -> list[Outcome]:
        """Apply messages, each exactly once in effect, in one transaction; one outcome per message.

        Messages of one saga are decided in the given order, each from the state its predecessors left.
        A batch of several sagas gets one attempt: after a conflict each saga is retried on its own, so
        one contended saga cannot hold the others back. (Records that name no saga are one group.)
        """
        by_saga: dict[str | None, list[int]] = {}
        for index, envelope in enumerate(envelopes):
            by_saga.setdefault(envelope.message.saga_id, []).append(index)
        if len(by_saga) > 1:
            try:
                return await self._in_unit(lambda uow, settled: self._apply(uow, envelopes, settled))
            except ConcurrencyConflict:
                log.info("concurrency conflict in a batch, retrying saga by saga",
                         extra={"sagas": len(by_saga), "messages": len(envelopes)})
        groups = list(by_saga.values())
        results = await asyncio.gather(*(self._retrying([envelopes[i] for i in indexes]) for indexes in groups))
        outcomes: dict[int, Outcome] = {}
        for indexes, result in zip(groups, results, strict=True):
            outcomes.update(zip(indexes, result, strict=True))
        return [outcomes[index] for index in range(len(envelopes))]

    async def fire_due_timers(self, limit: int, due_by_ms: int | None = None) -> int:
        """Claim due timers and handle them in the same transaction (a crash puts them back); with
        ``due_by_ms``, only those due by then as well as by now."""

        async def fire(uow: UnitOfWork, settled: Settled) -> int:
            now = self._clock_ms()
            rows = await uow.claim_due(now if due_by_ms is None else min(now, due_by_ms), limit)
            await self._apply(uow, [timer_envelope(row) for row in rows], settled)
            return len(rows)

        return await self._retrying_unit(fire, "timers")

    async def _retrying(self, envelopes: Sequence[Envelope]) -> list[Outcome]:
        return await self._retrying_unit(lambda uow, settled: self._apply(uow, envelopes, settled),
                                         f"saga {envelopes[0].message.saga_id}")

    async def _retrying_unit(self, work: Callable[[UnitOfWork, Settled], Awaitable[T]], what: str) -> T:
        for _ in range(MAX_CONFLICT_RETRIES):
            try:
                return await self._in_unit(work)
            except ConcurrencyConflict:
                log.info("concurrency conflict, retrying", extra={"work": what})
        raise ConcurrencyConflict(f"{what}: gave up after {MAX_CONFLICT_RETRIES} conflicts")

    async def _in_unit(self, work: Callable[[UnitOfWork, Settled], Awaitable[T]]) -> T:
        """``work`` in one unit of work; once it committed, what it settled is cached and reported."""
        settled = Settled()
        try:
            async with self._units.begin() as uow:
                result = await work(uow, settled)
        except BaseException:
            for saga_id in settled.sagas:  # the cache may be ahead of what is stored now
                self._cache.pop(saga_id, None)
            raise
        self._committed(settled)
        return result

    async def _apply(self, uow: UnitOfWork, envelopes: Sequence[Envelope], settled: Settled) -> list[Outcome]:
        """Claim, load, decide and write a batch: a fixed number of statements whatever its size."""
        if not envelopes:
            return []
        saga_ids = {e.message.saga_id for e in envelopes if e.message.saga_id is not None}
        settled.sagas |= saga_ids
        cached = {saga_id: self._cache.get(saga_id) for saga_id in saga_ids}
        claimed, stored = await uow.claim_and_load(
            [envelope.inbox_key for envelope in envelopes if envelope.inbox_key is not None],
            {saga_id: state.last_seq if state else 0 for saga_id, state in cached.items()})
        fresh = _first_claims([envelope.inbox_key for envelope in envelopes], claimed)
        states = {saga_id: self._fold_onto(state, stored.get(saga_id, ())) for saga_id, state in cached.items()}
        writes = PendingWrites(self._topics, self._consumer)
        outcomes = [self._decide(envelope, states, writes) if new else Outcome.DUPLICATE
                    for envelope, new in zip(envelopes, fresh, strict=True)]
        await writes.flush(uow)
        settled.add(states, writes)
        return outcomes

    def _decide(self, envelope: Envelope, states: dict[str, SagaState | None], writes: PendingWrites) -> Outcome:
        message = envelope.message
        state = states[message.saga_id] if message.saga_id is not None else None
        definition = self._definition_of(state)
        if isinstance(message, StartSaga) and (state is None or state.status is SagaStatus.REJECTED):
            definition = self._definitions.latest(message.saga_type)
        now = self._clock_ms()
        decision = decide(definition, state, message, now)
        after = decision.state  # a decision with obsolete timers or events is one of a saga
        for timer_id in decision.obsolete_timers:
            assert after is not None
            writes.delete_timer(after.saga_id, timer_id)
        if decision.events:
            assert after is not None
            states[after.saga_id] = writes.record(decision, envelope.message_id)
            log_decision(decision.events)
        if decision.dead_letter is None or envelope.raw is None:  # no record handed over (a test): no bytes
            return Outcome.APPLIED if decision.events else Outcome.NOTHING_TO_DO
        saga_type = message.saga_type if isinstance(message, RejectedRecord) else None
        writes.park(envelope.raw, decision.dead_letter, now, message.saga_id, saga_type)
        log.warning("message dead-lettered", extra={"saga_id": message.saga_id, "reason": decision.dead_letter,
                                                    "topic": envelope.raw.topic})
        return Outcome.DEAD_LETTERED

    def _definition_of(self, state: SagaState | None) -> SagaDefinition | None:
        if state is None or state.definition_version == 0 or state.status is SagaStatus.PURGED:
            return None
        return self._definitions.get(state.saga_type, state.definition_version)

    def _fold_onto(self, state: SagaState | None, stored: Sequence[StoredEvent]) -> SagaState | None:
        if not stored:
            return state
        events = [wire.decode_event(row.body) for row in stored]
        definition = self._definitions.for_history(events) if state is None else self._definition_of(state)
        for event in events:
            state = apply_event(definition, state, event)
            if definition is None and state.definition_version:
                definition = self._definition_of(state)
        return state

    def _committed(self, settled: Settled) -> None:
        """A unit of work committed: cache the states it settled, tell ``on_commit`` (new outbox rows) and
        ``on_settled`` (what it decided)."""
        # Only states whose transaction committed: a cached state must be a prefix of the stored history.
        for state in settled.states.values():
            self._cache[state.saga_id] = state
            self._cache.move_to_end(state.saga_id)
        while len(self._cache) > STATE_CACHE_SIZE:
            self._cache.popitem(last=False)
        if self._on_commit is not None:
            self._on_commit()
        if self._on_settled is not None:
            self._on_settled(settled)


def _first_claims(keys: Sequence[InboxKey | None], claimed: set[InboxKey]) -> list[bool]:
    """For each inbox key, whether this occurrence is the one the inbox claim took (the same message twice in
    a batch: the second is a duplicate; no key: nothing to dedupe). Consumes ``claimed``."""
    fresh = []
    for key in keys:
        fresh.append(key is None or key in claimed)
        if key is not None:
            claimed.discard(key)
    return fresh
