"""The orchestrator's one pipeline: messages → inbox → load → fold → decide → rows, in transactions.

Every consumed record arrives as a message (``inbound``): a record that is no acceptable message too, as a
RejectedRecord the core decides like any other, and every due timer. One message, or a batch of messages of
many sagas, per transaction: a batch costs the same few statements as one message (claim all, load all, then
one write), which is where the throughput comes from.

A failure belongs to its saga. A message that contradicts the saga it names (a reply for a step it does not
have, another saga's key) is refused like a bad record; a saga that cannot go on (its definition version is not
deployed, its history does not fit its definition, a decision cannot be recorded) is quarantined; a message
that fails in any other way is tried alone ``poison_attempts`` times, then its saga is quarantined. Each time
the message is dead-lettered with its bytes, and every other saga goes on. Only an unavailable store (the
adapter says which errors mean that) is waited out by the caller.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from ..schemas import wire
from ..schemas.codec import WireError
from ..schemas.event_types import SagaQuarantined, SagaReleased
from ..schemas.limits import MAX_REJECTION_REASON_CHARS
from ..schemas.message_types import ReleaseSaga, StartSaga
from ..schemas.topics import Topics
from .domain.decide import Decision, decide, quarantine, quarantine_unfolded
from .domain.definition import DefinitionRegistry, SagaDefinition
from .domain.errors import DomainError, InvalidMessage
from .domain.messages import RejectedRecord, TimerFired
from .domain.state import SagaState, SagaStatus, apply_event
from .inbound import Envelope, timer_envelope
from .observe import log_decision
from .outbound import PendingWrites, Settled
from .ports import ConcurrencyConflict, InboxKey, StoredEvent, UnitOfWork, UnitOfWorkFactory

log = logging.getLogger("saga.orchestrator")

CONSUMER_NAME = "orchestrator"
MAX_CONFLICT_RETRIES = 8
STATE_CACHE_BYTES = 256 * 1024 * 1024
"""How much memory the cache of folded states may take (estimated per state by ``state_bytes``)."""
POISON_ATTEMPTS = 3
"""How often a message that fails for no known reason is tried alone before its saga is quarantined."""

T = TypeVar("T")


class Outcome(StrEnum):
    """What handling one message amounted to."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    NOTHING_TO_DO = "nothing_to_do"
    DEAD_LETTERED = "dead_lettered"


@dataclass
class _Unfolded:
    """A saga whose history does not fold: why, and where its history ends."""

    error: Exception
    last_seq: int
    definition_version: int
    quarantined: bool  # its last SagaQuarantined has no SagaReleased after it


def state_bytes(state: SagaState) -> int:
    """An estimate of the memory a folded state takes: its input, outputs and texts, and a fixed overhead for
    the objects around them (a four-step trip state with a tiny input measures about 2 kB, as estimated)."""
    steps = sum(320 + len(step.output or b"") + len(step.last_error_message or "") for step in state.steps.values())
    texts = sum(len(text or "") for text in (state.failure_reason, state.cancel_reason, state.quarantine_reason,
                                             state.compensation_failure_reason))
    return 700 + len(state.input) + steps + texts


class StateCache:
    """Folded states by saga id, least recently used first, held within ``max_bytes`` (``state_bytes``)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._states: OrderedDict[str, tuple[SagaState, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def get(self, saga_id: str) -> SagaState | None:
        entry = self._states.get(saga_id)
        return entry[0] if entry is not None else None

    def put(self, state: SagaState) -> None:
        self.drop(state.saga_id)
        size = state_bytes(state)
        if size > self.max_bytes:
            return  # larger than the whole cache: read again each time rather than push everything out
        self._states[state.saga_id] = (state, size)
        self.bytes += size
        while self.bytes > self.max_bytes and self._states:
            _, (_, evicted) = self._states.popitem(last=False)
            self.bytes -= evicted

    def drop(self, saga_id: str) -> None:
        entry = self._states.pop(saga_id, None)
        if entry is not None:
            self.bytes -= entry[1]


class SagaService:
    """The orchestrator's application service; every decision comes from the fold of the saga's events.

    Folded states are cached per saga, but each transaction still reads the events recorded after the
    cached one, so a stale cache costs a read, never a wrong decision.
    """

    def __init__(self, units: UnitOfWorkFactory, definitions: DefinitionRegistry, topics: Topics,
                 clock_ms: Callable[[], int], consumer_name: str = CONSUMER_NAME,
                 on_commit: Callable[[], None] | None = None,
                 on_settled: Callable[[Settled], None] | None = None,
                 poison_attempts: int = POISON_ATTEMPTS, cache_bytes: int = STATE_CACHE_BYTES,
                 on_conflict: Callable[[], None] | None = None) -> None:
        self._units = units
        self._definitions = definitions
        self._topics = topics
        self._clock_ms = clock_ms
        self._consumer = consumer_name
        self._cache = StateCache(cache_bytes)
        self._on_commit = on_commit  # e.g. an in-process outbox relay's wake()
        self._on_settled = on_settled  # e.g. metrics of what the committed decisions did
        self._on_conflict = on_conflict  # e.g. saga_concurrency_conflicts_total: another writer won a saga
        self._poison_attempts = max(1, poison_attempts)

    async def handle(self, envelope: Envelope) -> Outcome:
        """Apply one message exactly once in effect; retried on an optimistic-concurrency conflict."""
        return (await self.handle_many([envelope]))[0]

    async def handle_many(self, envelopes: Sequence[Envelope]) -> list[Outcome]:
        """Apply messages, each exactly once in effect, in one transaction; one outcome per message.

        Messages of one saga are decided in the given order, each from the state its predecessors left.
        A batch of several sagas gets one attempt: after a conflict or a failure each saga is handled on its
        own, so one contended or poisoned saga cannot hold the others back. (Records that name no saga are
        one group.) Raises only when the store is unavailable.
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
                self._conflicted()
            except Exception as error:
                if self._units.unavailable(error):
                    raise
                log.warning("batch failed, handling saga by saga",
                            extra={"sagas": len(by_saga), "messages": len(envelopes), "error": repr(error)})
        groups = list(by_saga.values())
        results = await asyncio.gather(*(self._saga_alone([envelopes[i] for i in indexes]) for indexes in groups))
        outcomes: dict[int, Outcome] = {}
        for indexes, result in zip(groups, results, strict=True):
            outcomes.update(zip(indexes, result, strict=True))
        return [outcomes[index] for index in range(len(envelopes))]

    async def fire_due_timers(self, limit: int, due_by_ms: int | None = None,
                              partitions: Collection[int] | None = None) -> int:
        """Claim due timers and handle them in the same transaction (a crash puts them back); with
        ``due_by_ms``, only those due by then as well as by now; with ``partitions``, only those of sagas on
        them. A batch that fails (not for an unavailable store) is handled a timer at a time."""
        try:
            return await self._retrying_unit(
                lambda uow, settled: self._fire(uow, settled, limit, due_by_ms, partitions), "timers")
        except Exception as error:
            if self._units.unavailable(error) or limit == 1:
                raise
            log.warning("timer batch failed, firing one timer at a time", extra={"error": repr(error)})
        fired = 0
        while fired < limit and await self._fire_one(due_by_ms, partitions):
            fired += 1
        return fired

    async def next_timer_due_ms(self, partitions: Collection[int] | None = None) -> int | None:
        """When the earliest stored timer (of sagas on ``partitions``, when given) is due (epoch ms), None when
        there is none."""
        return await self._units.next_due_ms(partitions)

    async def _fire(self, uow: UnitOfWork, settled: Settled, limit: int, due_by_ms: int | None,
                    partitions: Collection[int] | None) -> int:
        now = self._clock_ms()
        rows = await uow.claim_due(now if due_by_ms is None else min(now, due_by_ms), limit, partitions)
        await self._apply(uow, [timer_envelope(row) for row in rows], settled)
        return len(rows)

    async def _fire_one(self, due_by_ms: int | None, partitions: Collection[int] | None) -> bool:
        """Fire the earliest due timer alone; after ``poison_attempts`` failures, quarantine its saga (the
        timer goes with the unit of work that does); False when none is due."""
        fired = await self._tried_alone(lambda uow, settled: self._fire(uow, settled, 1, due_by_ms, partitions),
                                        "a timer")
        if not isinstance(fired, Exception):
            return fired > 0
        error = fired

        async def quarantine_its_saga(uow: UnitOfWork, settled: Settled) -> bool:
            now = self._clock_ms()
            rows = await uow.claim_due(now if due_by_ms is None else min(now, due_by_ms), 1, partitions)
            for row in rows:
                await self._quarantine_alone(uow, settled, timer_envelope(row), error)
            return bool(rows)

        return await self._retrying_unit(quarantine_its_saga, "a timer's quarantine")

    async def _saga_alone(self, envelopes: Sequence[Envelope]) -> list[Outcome]:
        """One saga's messages in one unit of work; when that fails (not for an unavailable store), one message
        at a time."""
        try:
            return await self._retrying_unit(lambda uow, settled: self._apply(uow, envelopes, settled),
                                             f"saga {envelopes[0].message.saga_id}")
        except Exception as error:
            if self._units.unavailable(error):
                raise
            log.warning("messages of a saga failed, handling them one at a time",
                        extra={"saga_id": envelopes[0].message.saga_id, "error": repr(error)})
        return [await self._message_alone(envelope) for envelope in envelopes]

    async def _message_alone(self, envelope: Envelope) -> Outcome:
        """One message in its own unit of work, tried ``poison_attempts`` times; then it is dead-lettered and
        its saga quarantined."""
        outcomes = await self._tried_alone(lambda uow, settled: self._apply(uow, [envelope], settled),
                                           f"saga {envelope.message.saga_id}")
        if not isinstance(outcomes, Exception):
            [outcome] = outcomes
            return outcome
        error = outcomes
        log.error("message failed every time, quarantining its saga",
                  extra={"saga_id": envelope.message.saga_id, "message_id": envelope.message_id,
                         "attempts": self._poison_attempts, "error": repr(error)})
        return await self._retrying_unit(
            lambda uow, settled: self._quarantine_alone(uow, settled, envelope, error), "a quarantine")

    async def _tried_alone(self, work: Callable[[UnitOfWork, Settled], Awaitable[T]], what: str) -> T | Exception:
        """``work``'s result, tried up to ``poison_attempts`` times; the last failure when every try failed
        (an unavailable store is raised instead: waited out, never blamed on the message)."""
        error: Exception | None = None
        for _ in range(self._poison_attempts):
            try:
                return await self._retrying_unit(work, what)
            except Exception as failure:
                if self._units.unavailable(failure):
                    raise
                error = failure
        assert error is not None
        return error

    async def _quarantine_alone(self, uow: UnitOfWork, settled: Settled, envelope: Envelope,
                                error: Exception) -> Outcome:
        """A unit of work that only claims the message, quarantines its saga without folding its history (the
        fold may be what fails) and dead-letters the message."""
        saga_id = envelope.message.saga_id
        claims = [envelope.inbox_key] if envelope.inbox_key is not None else []
        claimed, stored = await uow.claim_and_load(claims, {saga_id: 0} if saga_id is not None else {})
        if claims and not claimed:
            return Outcome.DUPLICATE
        if saga_id is not None:
            settled.sagas.add(saga_id)
        writes = PendingWrites(self._topics, self._consumer)
        rows = stored.get(saga_id, []) if saga_id is not None else []
        now = self._clock_ms()
        if saga_id is not None and rows:
            outcome = self._decide_unfolded(envelope, _unfolded(saga_id, error, rows), writes, now)
        elif envelope.raw is not None:  # no saga to quarantine (none named, or none recorded yet)
            self._park(envelope, _clip(f"the message failed every time it was handled: {_describe(error)}"),
                       writes, now, None)
            outcome = Outcome.DEAD_LETTERED
        else:
            outcome = Outcome.NOTHING_TO_DO
        await writes.flush(uow)
        settled.add({}, writes)
        return outcome

    def _conflicted(self) -> None:
        if self._on_conflict is not None:
            self._on_conflict()

    async def _retrying_unit(self, work: Callable[[UnitOfWork, Settled], Awaitable[T]], what: str) -> T:
        for _ in range(MAX_CONFLICT_RETRIES):
            try:
                return await self._in_unit(work)
            except ConcurrencyConflict:
                log.info("concurrency conflict, retrying", extra={"work": what})
                self._conflicted()
        raise ConcurrencyConflict(f"{what}: gave up after {MAX_CONFLICT_RETRIES} conflicts")

    async def _in_unit(self, work: Callable[[UnitOfWork, Settled], Awaitable[T]]) -> T:
        """``work`` in one unit of work; once it committed, what it settled is cached and reported."""
        settled = Settled()
        try:
            async with self._units.begin() as uow:
                result = await work(uow, settled)
        except BaseException:
            for saga_id in settled.sagas:  # the cache may be ahead of what is stored now
                self._cache.drop(saga_id)
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
        states: dict[str, SagaState | None] = {}
        unfolded: dict[str, _Unfolded] = {}
        for saga_id, state in cached.items():
            rows = stored.get(saga_id, [])
            try:
                states[saga_id] = self._fold_onto(state, rows)
            except (DomainError, WireError) as error:  # the history does not fold: the saga cannot go on
                unfolded[saga_id] = _unfolded(saga_id, error, rows, state)
        writes = PendingWrites(self._topics, self._consumer)
        now = self._clock_ms()
        outcomes = []
        for envelope, new in zip(envelopes, fresh, strict=True):
            named = envelope.message.saga_id
            if not new:
                outcomes.append(Outcome.DUPLICATE)
            elif named is not None and named in unfolded:
                outcomes.append(self._decide_unfolded(envelope, unfolded[named], writes, now))
            else:
                outcomes.append(self._decide(envelope, states, writes, now))
        await writes.flush(uow)
        settled.add({saga_id: state for saga_id, state in states.items() if saga_id not in unfolded}, writes)
        return outcomes

    def _decide(self, envelope: Envelope, states: dict[str, SagaState | None], writes: PendingWrites,
                now: int) -> Outcome:
        message = envelope.message
        state = states[message.saga_id] if message.saga_id is not None else None
        definition: SagaDefinition | None = None
        try:
            definition = self._definition_of(state)
            if isinstance(message, StartSaga) and (state is None or state.status is SagaStatus.REJECTED):
                definition = self._definitions.latest(message.saga_type)
            decision = decide(definition, state, message, now)
        except InvalidMessage as error:  # the message contradicts its saga: refused like a bad record
            decision = decide(definition, state, RejectedRecord(saga_id=message.saga_id, saga_type=None,
                                                                reason=_clip(str(error))), now)
        except DomainError as error:  # its definition is not deployed, or does not fit its history
            if state is None:
                raise
            decision = quarantine(definition, state, _clip(f"{type(error).__name__}: {error}"), envelope.message_id,
                                  now)
        return self._record(envelope, decision, states, writes, now, definition, state)

    def _record(self, envelope: Envelope, decision: Decision, states: dict[str, SagaState | None],
                writes: PendingWrites, now: int, definition: SagaDefinition | None,
                before: SagaState | None) -> Outcome:
        message = envelope.message
        try:
            after = self._write(decision, envelope, writes)
        except WireError as error:  # the decision cannot be written (a value over its limit): the saga stops
            if before is None:
                raise
            decision = quarantine(definition, before, _clip(f"decision not recorded: {error}"),
                                  envelope.message_id, now)
            after = self._write(decision, envelope, writes)
        if after is not None:
            states[after.saga_id] = after
            log_decision(decision.events)
        if decision.dead_letter is None or envelope.raw is None:  # no record handed over (a test): no bytes
            return Outcome.APPLIED if decision.events else Outcome.NOTHING_TO_DO
        saga_type = message.saga_type if isinstance(message, RejectedRecord) else None
        self._park(envelope, decision.dead_letter, writes, now, saga_type)
        return Outcome.DEAD_LETTERED

    @staticmethod
    def _write(decision: Decision, envelope: Envelope, writes: PendingWrites) -> SagaState | None:
        """Add ``decision``'s rows to ``writes``, all of them or (WireError) none; the saga's state after it."""
        if decision.state is not None:
            for timer_id in decision.obsolete_timers:
                writes.delete_timer(decision.state.saga_id, timer_id)
        return writes.record(decision, envelope.message_id) if decision.events else None

    def _decide_unfolded(self, envelope: Envelope, unfolded: _Unfolded, writes: PendingWrites, now: int) -> Outcome:
        """A message for a saga whose history does not fold (or that failed every time): the saga is quarantined,
        once; every message for it is dead-lettered, a timer changes nothing."""
        message = envelope.message
        if unfolded.quarantined:
            if isinstance(message, TimerFired):
                return Outcome.NOTHING_TO_DO
            what = "cannot be released" if isinstance(message, ReleaseSaga) else "is quarantined"
            reason = f"saga {message.saga_id!r} {what}: {_describe(unfolded.error)}"
        else:
            reason = _clip(_describe(unfolded.error))
            assert message.saga_id is not None
            decision = quarantine_unfolded(message.saga_id, unfolded.last_seq, unfolded.definition_version, reason,
                                           envelope.message_id, now)
            writes.record_unfolded(decision, envelope.message_id)
            log_decision(decision.events)
            unfolded.quarantined, unfolded.last_seq = True, unfolded.last_seq + 1
        if envelope.raw is None:
            return Outcome.NOTHING_TO_DO if isinstance(message, TimerFired) else Outcome.DEAD_LETTERED
        self._park(envelope, reason, writes, now, None)
        return Outcome.DEAD_LETTERED

    def _park(self, envelope: Envelope, reason: str, writes: PendingWrites, now: int, saga_type: str | None) -> None:
        assert envelope.raw is not None
        writes.park(envelope.raw, reason, now, envelope.message.saga_id, saga_type)
        log.warning("message dead-lettered", extra={"saga_id": envelope.message.saga_id, "reason": reason,
                                                    "topic": envelope.raw.topic})

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
            self._cache.put(state)
        if self._on_commit is not None:
            self._on_commit()
        if self._on_settled is not None:
            self._on_settled(settled)


def _unfolded(saga_id: str, error: Exception, rows: Sequence[StoredEvent],
              cached: SagaState | None = None) -> _Unfolded:
    """What is known of a saga whose history does not fold: from its stored rows (and the cached state they
    follow, if any), without folding them."""
    last_seq = rows[-1].seq if rows else (cached.last_seq if cached is not None else 0)
    version = cached.definition_version if cached is not None else 0
    for row in reversed(rows):
        try:
            version = wire.decode_event(row.body).definition_version
            break
        except WireError:
            continue
    marks = [row.event_type for row in rows if row.event_type in (SagaQuarantined.__name__, SagaReleased.__name__)]
    already = (marks[-1] == SagaQuarantined.__name__ if marks
               else cached is not None and cached.status is SagaStatus.QUARANTINED)
    return _Unfolded(error, last_seq, version, already)


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def _clip(reason: str) -> str:
    return reason if len(reason) <= MAX_REJECTION_REASON_CHARS else reason[:MAX_REJECTION_REASON_CHARS] + "..."


def _first_claims(keys: Sequence[InboxKey | None], claimed: set[InboxKey]) -> list[bool]:
    """For each inbox key, whether this occurrence is the one the inbox claim took (the same message twice in
    a batch: the second is a duplicate; no key: nothing to dedupe). Consumes ``claimed``."""
    fresh = []
    for key in keys:
        fresh.append(key is None or key in claimed)
        if key is not None:
            claimed.discard(key)
    return fresh
