"""Handle one incoming message in one transaction: inbox → load → fold → decide → append → outbox."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from enum import StrEnum

from orchestrator import wire
from orchestrator.domain.decide import Decision, decide
from orchestrator.domain.definition import DefinitionRegistry
from orchestrator.domain.errors import UnknownSaga
from orchestrator.domain.events import Event, SagaRejected
from orchestrator.domain.messages import StartSaga, Timer, TimerFired
from orchestrator.domain.state import SagaState, SagaStatus, apply_event
from orchestrator.envelope import Envelope, Rejection, timer_envelope
from orchestrator.outbound import command_message, dead_letter_message, event_message
from orchestrator.ports import (
    ConcurrencyConflict,
    SagaSummaryRow,
    StoredEvent,
    TimerRow,
    UnitOfWork,
    UnitOfWorkFactory,
)
from schemas.topics import Topics

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
                 clock_ms: Callable[[], int], consumer_name: str = CONSUMER_NAME) -> None:
        self._units = units
        self._definitions = definitions
        self._topics = topics
        self._clock_ms = clock_ms
        self._consumer = consumer_name
        self._cache: OrderedDict[str, SagaState] = OrderedDict()

    async def handle(self, envelope: Envelope) -> Outcome:
        """Apply one message exactly once in effect; retried on an optimistic-concurrency conflict."""
        for _ in range(MAX_CONFLICT_RETRIES):
            settled: list[SagaState] = []
            try:
                async with self._units.begin() as uow:
                    outcome = await self._apply(uow, envelope, settled)
            except ConcurrencyConflict:
                self._cache.pop(envelope.message.saga_id, None)
                log.info("concurrency conflict, retrying", extra={"saga_id": envelope.message.saga_id})
                continue
            except BaseException:
                self._cache.pop(envelope.message.saga_id, None)
                raise
            self._remember(settled)
            return outcome
        raise ConcurrencyConflict(f"saga {envelope.message.saga_id}: gave up after {MAX_CONFLICT_RETRIES} conflicts")

    async def fire_due_timers(self, limit: int) -> int:
        """Claim due timers and handle them in the same transaction (a crash puts them back)."""
        for _ in range(MAX_CONFLICT_RETRIES):
            settled: list[SagaState] = []
            try:
                async with self._units.begin() as uow:
                    rows = await uow.claim_due(self._clock_ms(), limit)
                    for row in rows:
                        await self._apply(uow, timer_envelope(row), settled)
            except ConcurrencyConflict:
                self._cache.clear()
                continue
            except BaseException:
                self._cache.clear()
                raise
            self._remember(settled)
            return len(rows)
        raise ConcurrencyConflict("timers: gave up after repeated conflicts")

    async def reject(self, rejection: Rejection) -> Outcome:
        """Dead-letter a record; when its saga id is readable, record SagaRejected in that saga's stream."""
        for _ in range(MAX_CONFLICT_RETRIES):
            settled: list[SagaState] = []
            try:
                async with self._units.begin() as uow:
                    outcome = await self._reject(uow, rejection, settled)
            except ConcurrencyConflict:
                self._cache.pop(rejection.saga_id or "", None)
                continue
            except BaseException:
                self._cache.pop(rejection.saga_id or "", None)
                raise
            self._remember(settled)
            return outcome
        raise ConcurrencyConflict(f"saga {rejection.saga_id}: gave up recording a rejection")

    async def _apply(self, uow: UnitOfWork, envelope: Envelope, settled: list[SagaState]) -> Outcome:
        message = envelope.message
        if not await uow.claim_message(self._consumer, envelope.message_id):
            return Outcome.DUPLICATE
        state = await self._load(uow, message.saga_id)
        definition = self._definition_of(state)
        if isinstance(message, StartSaga) and (state is None or state.status is SagaStatus.REJECTED):
            definition = self._definitions.latest(message.saga_type)
        now = self._clock_ms()
        try:
            decision = decide(definition, state, message, now)
        except UnknownSaga as unknown:
            if isinstance(message, TimerFired) or envelope.raw is None:
                return Outcome.NOTHING_TO_DO
            await uow.add_outbox([dead_letter_message(self._topics, envelope.raw, str(unknown),
                                                      message.saga_id, self._consumer, now)])
            return Outcome.DEAD_LETTERED
        for timer_id in decision.obsolete_timers:
            await uow.delete_timer(message.saga_id, timer_id)
        if decision.is_empty:
            return Outcome.NOTHING_TO_DO
        settled.append(await self._record(uow, decision, envelope.message_id))
        return Outcome.APPLIED

    async def _reject(self, uow: UnitOfWork, rejection: Rejection, settled: list[SagaState]) -> Outcome:
        message_id = rejection.message_id or rejection.raw.position_id
        if not await uow.claim_message(self._consumer, message_id):
            return Outcome.DUPLICATE
        now = self._clock_ms()
        await uow.add_outbox([dead_letter_message(self._topics, rejection.raw, rejection.reason,
                                                  rejection.saga_id, self._consumer, now)])
        log.warning("message dead-lettered", extra={"saga_id": rejection.saga_id, "reason": rejection.reason,
                                                    "topic": rejection.raw.topic})
        if not rejection.saga_id:
            return Outcome.DEAD_LETTERED
        state = await self._load(uow, rejection.saga_id)
        rejected = SagaRejected(
            saga_id=rejection.saga_id, seq=(state.last_seq if state else 0) + 1,
            definition_version=state.definition_version if state else 0, occurred_at=now,
            saga_type=rejection.saga_type, reason=rejection.reason,
        )
        after = apply_event(self._definition_of(state), state, rejected)
        settled.append(await self._record(uow, Decision(events=(rejected,), state=after), message_id))
        return Outcome.DEAD_LETTERED

    def _definition_of(self, state: SagaState | None):  # type: ignore[no-untyped-def]
        if state is None or state.definition_version == 0:
            return None
        return self._definitions.get(state.saga_type, state.definition_version)

    async def _load(self, uow: UnitOfWork, saga_id: str) -> SagaState | None:
        cached = self._cache.get(saga_id)
        stored = await uow.load_events(saga_id, after_seq=cached.last_seq if cached else 0)
        if not stored:
            return cached
        events = [wire.decode_event(row.body) for row in stored]
        state = cached
        if state is None:
            definition = self._definitions.for_history(events)
        else:
            definition = self._definition_of(state)
        for event in events:
            state = apply_event(definition, state, event)
            if definition is None and state.definition_version:
                definition = self._definition_of(state)
        return state

    async def _record(self, uow: UnitOfWork, decision: Decision, causation_id: str) -> SagaState:
        new_events = decision.events
        state = decision.state
        assert state is not None
        bodies = [wire.encode_event(event) for event in new_events]
        await uow.append_events([
            StoredEvent(saga_id=event.saga_id, seq=event.seq, event_type=type(event).__name__, body=body,
                        recorded_at_ms=event.occurred_at)
            for event, body in zip(new_events, bodies, strict=True)
        ])
        saga_type = state.saga_type or None
        outgoing = [event_message(self._topics, event, body, saga_type, causation_id)
                    for event, body in zip(new_events, bodies, strict=True)]
        outgoing += [command_message(self._topics, command, causation_id) for command in decision.commands]
        await uow.add_outbox(outgoing)
        if decision.timers:
            await uow.schedule_timers([_timer_row(timer) for timer in decision.timers])
        await uow.upsert_summary(_summary(state))
        _log_events(new_events)
        return state

    def _remember(self, states: Sequence[SagaState]) -> None:
        # Only states whose transaction committed: a cached state must be a prefix of the stored history.
        for state in states:
            self._cache[state.saga_id] = state
            self._cache.move_to_end(state.saga_id)
        while len(self._cache) > STATE_CACHE_SIZE:
            self._cache.popitem(last=False)


def _timer_row(timer: Timer) -> TimerRow:
    return TimerRow(saga_id=timer.saga_id, timer_id=timer.timer_id, kind=str(timer.kind), step=timer.step,
                    attempt=timer.attempt, due_at_ms=timer.due_at)


def _summary(state: SagaState) -> SagaSummaryRow:
    return SagaSummaryRow(
        saga_id=state.saga_id, saga_type=state.saga_type, tenant_id=state.tenant_id, status=state.status.value,
        started_at_ms=state.started_at, updated_at_ms=state.updated_at, last_seq=state.last_seq,
        failed_step=state.failed_step or state.compensation_failed_step, reason=state.reason,
    )


def _log_events(events: Sequence[Event]) -> None:
    for event in events:
        log.info(type(event).__name__, extra={"saga_id": event.saga_id, "seq": event.seq,
                                              "step": getattr(event, "step", None)})
