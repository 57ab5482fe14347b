"""Handle incoming messages in transactions: inbox → load → fold → decide → append → outbox.

One message, or a batch of messages of many sagas, per transaction: a batch costs the same few statements
as one message (claim all, load all, then one write per table), which is where the throughput comes from.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum

from ..outbox.dead_letters import dead_letter_message
from ..schemas import wire
from ..schemas.event_types import SagaRejected
from ..schemas.message_types import StartSaga
from ..schemas.topics import Topics
from .decision_log import log_decision
from .domain.decide import Decision, decide
from .domain.definition import DefinitionRegistry
from .domain.errors import UnknownSaga
from .domain.messages import TimerFired
from .domain.state import SagaState, SagaStatus, apply_event
from .envelope import Envelope, Rejection, timer_envelope
from .ports import ConcurrencyConflict, StoredEvent, UnitOfWork, UnitOfWorkFactory
from .writes import PendingWrites, Settled

log = logging.getLogger("saga.orchestrator")

CONSUMER_NAME = "orchestrator"
MAX_CONFLICT_RETRIES = 8
STATE_CACHE_SIZE = 20_000


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
        one contended saga cannot hold the others back.
        """
        by_saga: dict[str, list[int]] = {}
        for index, envelope in enumerate(envelopes):
            by_saga.setdefault(envelope.message.saga_id, []).append(index)
        if len(by_saga) > 1:
            try:
                return await self._apply_in_one_unit(envelopes)
            except ConcurrencyConflict:
                log.info("concurrency conflict in a batch, retrying saga by saga",
                         extra={"sagas": len(by_saga), "messages": len(envelopes)})
        groups = list(by_saga.values())
        results = await asyncio.gather(*(self._retrying([envelopes[i] for i in indexes]) for indexes in groups))
        outcomes: dict[int, Outcome] = {}
        for indexes, result in zip(groups, results, strict=True):
            outcomes.update(zip(indexes, result, strict=True))
        return [outcomes[index] for index in range(len(envelopes))]

    async def _retrying(self, envelopes: Sequence[Envelope]) -> list[Outcome]:
        for _ in range(MAX_CONFLICT_RETRIES):
            try:
                return await self._apply_in_one_unit(envelopes)
            except ConcurrencyConflict:
                log.info("concurrency conflict, retrying", extra={"saga_id": envelopes[0].message.saga_id})
        raise ConcurrencyConflict(
            f"saga {envelopes[0].message.saga_id}: gave up after {MAX_CONFLICT_RETRIES} conflicts")

    async def _apply_in_one_unit(self, envelopes: Sequence[Envelope]) -> list[Outcome]:
        settled = Settled()
        try:
            async with self._units.begin() as uow:
                outcomes = await self._apply(uow, envelopes, settled)
        except BaseException:
            for envelope in envelopes:  # the cache may be ahead of what is stored now
                self._cache.pop(envelope.message.saga_id, None)
            raise
        self._committed(settled)
        return outcomes

    async def fire_due_timers(self, limit: int, due_by_ms: int | None = None) -> int:
        """Claim due timers and handle them in the same transaction (a crash puts them back); with
        ``due_by_ms``, only those due by then as well as by now."""
        for _ in range(MAX_CONFLICT_RETRIES):
            settled = Settled()
            now = self._clock_ms()
            try:
                async with self._units.begin() as uow:
                    rows = await uow.claim_due(now if due_by_ms is None else min(now, due_by_ms), limit)
                    await self._apply(uow, [timer_envelope(row) for row in rows], settled)
            except ConcurrencyConflict:
                self._cache.clear()
                continue
            except BaseException:
                self._cache.clear()
                raise
            self._committed(settled)
            return len(rows)
        raise ConcurrencyConflict("timers: gave up after repeated conflicts")

    async def reject(self, rejection: Rejection) -> Outcome:
        """Dead-letter a record; when its saga id is readable, record SagaRejected in that saga's stream."""
        for _ in range(MAX_CONFLICT_RETRIES):
            settled = Settled()
            try:
                async with self._units.begin() as uow:
                    outcome = await self._reject(uow, rejection, settled)
            except ConcurrencyConflict:
                self._cache.pop(rejection.saga_id or "", None)
                continue
            except BaseException:
                self._cache.pop(rejection.saga_id or "", None)
                raise
            self._committed(settled)
            return outcome
        raise ConcurrencyConflict(f"saga {rejection.saga_id}: gave up recording a rejection")

    async def reject_many(self, rejections: Sequence[Rejection]) -> list[Outcome]:
        """``reject`` for many records in one transaction: a flood of bad input costs what a batch of good
        input does, rather than a transaction per record. After a conflict each is retried on its own."""
        if len(rejections) > 1:
            settled = Settled()
            try:
                async with self._units.begin() as uow:
                    outcomes = await self._reject_batch(uow, rejections, settled)
            except ConcurrencyConflict:
                log.info("concurrency conflict in a batch of rejections, retrying one by one",
                         extra={"messages": len(rejections)})
            except BaseException:
                for rejection in rejections:
                    self._cache.pop(rejection.saga_id or "", None)
                raise
            else:
                self._committed(settled)
                return outcomes
            for rejection in rejections:
                self._cache.pop(rejection.saga_id or "", None)
        return [await self.reject(rejection) for rejection in rejections]

    async def _apply(self, uow: UnitOfWork, envelopes: Sequence[Envelope],
                     settled: Settled) -> list[Outcome]:
        """Claim, load, decide and write a batch: a fixed number of statements whatever its size."""
        if not envelopes:
            return []
        cached = {e.message.saga_id: self._cache.get(e.message.saga_id) for e in envelopes}
        claimed, stored = await uow.claim_and_load(
            self._consumer, [envelope.message_id for envelope in envelopes],
            {saga_id: state.last_seq if state else 0 for saga_id, state in cached.items()})
        fresh = _first_claims([envelope.message_id for envelope in envelopes], claimed)
        states = {saga_id: self._fold_onto(state, stored.get(saga_id, ())) for saga_id, state in cached.items()}
        writes = PendingWrites(self._topics)
        outcomes = [self._decide(envelope, states, writes) if new else Outcome.DUPLICATE
                    for envelope, new in zip(envelopes, fresh, strict=True)]
        await writes.flush(uow)
        settled.add(states, writes, outcomes.count(Outcome.DEAD_LETTERED))
        return outcomes

    def _decide(self, envelope: Envelope, states: dict[str, SagaState | None], writes: PendingWrites) -> Outcome:
        message = envelope.message
        state = states[message.saga_id]
        definition = self._definition_of(state)
        if isinstance(message, StartSaga) and (state is None or state.status is SagaStatus.REJECTED):
            definition = self._definitions.latest(message.saga_type)
        now = self._clock_ms()
        try:
            decision = decide(definition, state, message, now)
        except UnknownSaga as unknown:
            if isinstance(message, TimerFired) or envelope.raw is None:
                return Outcome.NOTHING_TO_DO
            writes.outbox.append(dead_letter_message(self._topics.dlq, envelope.raw, reason=str(unknown),
                                                     consumer=self._consumer, now_ms=now, saga_id=message.saga_id))
            return Outcome.DEAD_LETTERED
        for timer_id in decision.obsolete_timers:
            writes.delete_timer(message.saga_id, timer_id)
        if decision.is_empty:
            return Outcome.NOTHING_TO_DO
        states[message.saga_id] = writes.record(decision, envelope.message_id)
        log_decision(decision.events)
        return Outcome.APPLIED

    async def _reject(self, uow: UnitOfWork, rejection: Rejection, settled: Settled) -> Outcome:
        return (await self._reject_batch(uow, [rejection], settled))[0]

    async def _reject_batch(self, uow: UnitOfWork, rejections: Sequence[Rejection],
                            settled: Settled) -> list[Outcome]:
        """Claim, dead-letter and record SagaRejected for a batch, in a fixed number of statements."""
        message_ids = [rejection.message_id or rejection.raw.position_id for rejection in rejections]
        claimed = await uow.claim_messages(self._consumer, message_ids)
        fresh = _first_claims(message_ids, claimed)
        states = await self._load_many(uow, {rejection.saga_id for rejection, new in zip(rejections, fresh,
                                                                                       strict=True)
                                              if new and rejection.saga_id})
        now = self._clock_ms()
        writes = PendingWrites(self._topics)
        outcomes = []
        for rejection, message_id, new in zip(rejections, message_ids, fresh, strict=True):
            if not new:
                outcomes.append(Outcome.DUPLICATE)
                continue
            outcomes.append(Outcome.DEAD_LETTERED)
            writes.outbox.append(dead_letter_message(self._topics.dlq, rejection.raw, reason=rejection.reason,
                                                     consumer=self._consumer, now_ms=now, saga_id=rejection.saga_id,
                                                     saga_type=rejection.saga_type))
            log.warning("message dead-lettered", extra={"saga_id": rejection.saga_id, "reason": rejection.reason,
                                                        "topic": rejection.raw.topic})
            if not rejection.saga_id:
                continue
            state = states[rejection.saga_id]
            rejected = SagaRejected(
                saga_id=rejection.saga_id, seq=(state.last_seq if state else 0) + 1,
                definition_version=state.definition_version if state else 0, occurred_at=now,
                saga_type=rejection.saga_type, reason=rejection.reason,
            )
            after = apply_event(self._definition_of(state), state, rejected)
            states[rejection.saga_id] = writes.record(Decision(events=(rejected,), state=after), message_id)
            log_decision((rejected,))
        await writes.flush(uow)
        settled.add(states, writes, outcomes.count(Outcome.DEAD_LETTERED))
        return outcomes

    def _definition_of(self, state: SagaState | None):  # type: ignore[no-untyped-def]
        if state is None or state.definition_version == 0 or state.status is SagaStatus.PURGED:
            return None
        return self._definitions.get(state.saga_type, state.definition_version)

    async def _load(self, uow: UnitOfWork, saga_id: str) -> SagaState | None:
        return (await self._load_many(uow, {saga_id}))[saga_id]

    async def _load_many(self, uow: UnitOfWork, saga_ids: Iterable[str]) -> dict[str, SagaState | None]:
        """The current state of each saga: its cached state plus the events stored after it, in one read."""
        cached = {saga_id: self._cache.get(saga_id) for saga_id in saga_ids}
        stored = await uow.load_events_after({saga_id: state.last_seq if state else 0
                                              for saga_id, state in cached.items()})
        return {saga_id: self._fold_onto(state, stored.get(saga_id, ())) for saga_id, state in cached.items()}

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


def _first_claims(message_ids: Sequence[str], claimed: set[str]) -> list[bool]:
    """For each message id, whether this occurrence is the one the inbox claim took (the same message twice
    in a batch: the second is a duplicate). Consumes ``claimed``."""
    fresh = []
    for message_id in message_ids:
        fresh.append(message_id in claimed)
        claimed.discard(message_id)
    return fresh

