"""The orchestrator's one pipeline: messages → inbox → load → fold → decide → rows, in transactions.

Every consumed record arrives as a message (``inbound``): a record that is no acceptable message too, as a
RejectedRecord the core decides like any other, and every due timer. One message, or a batch of messages of
many sagas, per transaction: a batch costs the same few statements as one message (claim all, load all, then
one write), which is where the throughput comes from.

A failure belongs to its saga. A message that contradicts the saga it names (a reply for a step it does not
have, another saga's key) is refused like a bad record; a saga that cannot go on (its definition version is not
deployed, its history does not fit its definition, a decision cannot be recorded) is quarantined. Anything else
that fails a batch goes down the isolation ladder (``infra.isolation``): each saga alone, then the message alone
``poison_attempts`` times, then its saga is quarantined and the message dead-lettered with its bytes; every
other saga goes on. Due timers take the same ladder. A platform fault (``infra.failures``) is raised to the
caller, which waits it out.

During a rolling deploy a saga may reach an instance that lacks its definition version, or the shape it runs on
(a patch marker deployed on another instance: ``ShapeChanged``), while another member of the group serves it
(``served_elsewhere``, what the group's last assignment said): that is no reason to quarantine it.
``ServedElsewhere``, a platform fault, is raised instead: the messages wait unacknowledged until the partitions
move to a member that serves the version and shape (orchestrator/assignment.py gives them to it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Collection, Hashable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from cachetools import LRUCache

from ..infra import tracing
from ..infra.failures import PlatformUnavailable
from ..infra.isolation import IsolationLadder
from ..infra.logging import saga_trace_var
from ..schemas import wire
from ..schemas.codec import WireError
from ..schemas.event_types import SagaMigrated, SagaQuarantined, SagaReleased, SagaStarted
from ..schemas.limits import MAX_REJECTION_REASON_CHARS
from ..schemas.message_types import Lever, OperateSaga, ReleaseSaga, SignalSaga, StartSaga
from ..schemas.registry import SchemaRegistry, default_registry
from ..schemas.topics import Topics
from .domain.decide import Decision, decide, quarantine, quarantine_unfolded
from .domain.definition import DefinitionRegistry, SagaDefinition
from .domain.errors import DomainError, InvalidMessage, ShapeChanged, StartRefused, UnknownDefinition
from .domain.messages import IncomingMessage, RejectedRecord, TimerFired
from .domain.model import state_bytes
from .domain.starting import start_definition
from .domain.state import SagaState, SagaStatus, apply_event
from .inbound import Envelope, timer_envelope
from .observe import describe_decision, log_decision
from .outbound import Outgoing, PendingWrites, Settled
from .ports import InboxKey, StoredEvent, TimerRow, UnitOfWork, UnitOfWorkFactory

log = logging.getLogger("saga.orchestrator")

CONSUMER_NAME = "orchestrator"
POISON_ATTEMPTS = 3
DECISION_SPAN = "saga.decide"
"""The span of deciding a message, in its saga's trace: a child of the saga's recorded traceparent (a StartSaga's
own before its saga has one); the commands it sends carry it."""
STATE_CACHE_BYTES = 256 * 1024 * 1024
"""How much memory the folded states kept between transactions may take (estimated per state by
``state_bytes``). A cached state is always a prefix of the stored history (only states whose transaction
committed go in), and each transaction still reads the events recorded after it, so a stale entry costs a read,
never a wrong decision."""
"""How often a message that fails for no known reason is tried alone before its saga is quarantined."""

T = TypeVar("T")


class Outcome(StrEnum):
    """What handling one message amounted to."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    NOTHING_TO_DO = "nothing_to_do"
    DEAD_LETTERED = "dead_lettered"


class ServedElsewhere(PlatformUnavailable):
    """A saga's definition version, or the shape of it the saga runs on, is not deployed here but another member
    of the group serves it: not now (wait, unacknowledged), never a quarantine."""


@dataclass
class _Unfolded:
    """A saga whose history does not fold: why, and where its history ends."""

    error: Exception
    last_seq: int
    definition_version: int
    quarantined: bool  # its last SagaQuarantined has no SagaReleased after it


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
                 on_conflict: Callable[[], None] | None = None, schemas: SchemaRegistry | None = None,
                 served_elsewhere: Callable[[str, int, str | None], bool] | None = None) -> None:
        self._units = units
        self._schemas = schemas or default_registry()  # the events, the commands, a start input
        self._definitions = definitions
        self._outgoing = Outgoing(topics, self._schemas)  # topic names and registry, looked up once
        self._clock_ms = clock_ms
        self._consumer = consumer_name
        self._cache: LRUCache[str, SagaState] = LRUCache(cache_bytes, getsizeof=state_bytes)
        self._on_commit = on_commit  # e.g. an in-process outbox relay's wake()
        self._on_settled = on_settled  # e.g. metrics of what the committed decisions did
        # Whether a member of the group serves a (saga type, version) in the shape of that fingerprint (None: in
        # any shape): e.g. GroupView.serves of the consumer.
        self._served_elsewhere = served_elsewhere
        # on_conflict: e.g. saga_concurrency_conflicts_total, told each time another writer won a saga.
        self._messages = IsolationLadder(_Messages(self), "orchestrator messages", poison_attempts,
                                         span=DECISION_SPAN, concurrent_groups=True, on_conflict=on_conflict)
        self._timers = IsolationLadder(_DueTimers(self), "orchestrator timers", poison_attempts,
                                       span=DECISION_SPAN, concurrent_groups=True, on_conflict=on_conflict)

    async def handle(self, envelope: Envelope) -> Outcome:
        """Apply one message exactly once in effect: a batch of one."""
        return (await self.handle_many([envelope]))[0]

    async def handle_many(self, envelopes: Sequence[Envelope]) -> list[Outcome]:
        """Apply messages, each exactly once in effect, in one transaction; one outcome per message.

        Messages of one saga are decided in the given order, each from the state its predecessors left. A batch
        that fails goes down the isolation ladder, its sagas handled at once, each in a transaction of its own
        (records that name no saga are one group). Raises only a platform fault: nothing of the batch is then
        recorded, and the caller hands it over again once the platform is back.
        """
        return await self._messages.run(envelopes)

    async def fire_due_timers(self, limit: int, due_by_ms: int | None = None,
                              partitions: Collection[int] | None = None) -> int:
        """Fire up to ``limit`` due timers in one transaction (with ``due_by_ms``, only those due by then as well
        as by now; with ``partitions``, only those of sagas on them); how many fired. Each is claimed in the
        transaction that handles it (a crash puts it back); a batch that fails goes down the isolation ladder as
        messages do. Raises only a platform fault."""
        now = self._clock_ms()
        due = await self._units.due_timers(now if due_by_ms is None else min(now, due_by_ms), limit, partitions)
        if not due:
            return 0
        outcomes = await self._timers.run(due)
        return sum(outcome is not Outcome.DUPLICATE for outcome in outcomes)

    async def next_timer_due_ms(self, partitions: Collection[int] | None = None) -> int | None:
        """When the earliest stored timer (of sagas on ``partitions``, when given) is due (epoch ms), None when
        there is none."""
        return await self._units.next_due_ms(partitions)

    async def _fire(self, uow: UnitOfWork, settled: Settled, due: Sequence[TimerRow]) -> list[Outcome]:
        """Claim ``due`` (a timer changed or fired since it was read is left out: DUPLICATE) and handle them."""
        claimed = await uow.claim_timers(due)
        outcomes = dict(zip(((row.saga_id, row.timer_id) for row in claimed),
                            await self._apply(uow, [timer_envelope(row) for row in claimed], settled), strict=True))
        return [outcomes.get((row.saga_id, row.timer_id), Outcome.DUPLICATE) for row in due]

    async def _quarantine_timer(self, uow: UnitOfWork, settled: Settled, row: TimerRow, error: Exception) -> Outcome:
        """The end of a timer that failed every time: its saga is quarantined (the timer goes with this unit)."""
        claimed = await uow.claim_timers([row])
        if not claimed:
            return Outcome.DUPLICATE
        return await self._quarantine_alone(uow, settled, timer_envelope(claimed[0]), error)

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
        writes = PendingWrites(self._outgoing, self._consumer)
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
        states: dict[str, SagaState | None] = {}
        unfolded: dict[str, _Unfolded] = {}
        for saga_id, state in cached.items():
            rows = stored.get(saga_id, [])
            try:
                states[saga_id] = self._fold_onto(state, rows)
            except (DomainError, WireError) as error:  # the history does not fold: the saga cannot go on
                unfolded[saga_id] = _unfolded(saga_id, error, rows, state)
        writes = PendingWrites(self._outgoing, self._consumer)
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
        # The saga's recorded trace (a StartSaga's own before its saga has one): the decision's log lines carry
        # it, and its span (spans on) is its child.
        traceparent = (state.traceparent if state is not None else None) or getattr(message, "traceparent", None)
        if tracing.tracer is not None:
            return self._decide_traced(envelope, traceparent, state, states, writes, now)
        token = saga_trace_var.set(traceparent)  # spans off: no span, only the log lines' trace id
        try:
            definition, decision = self._decided(envelope, message, state, now)
            return self._record(envelope, decision, states, writes, now, definition, state)
        finally:
            saga_trace_var.reset(token)

    def _decide_traced(self, envelope: Envelope, traceparent: str | None, state: SagaState | None,
                       states: dict[str, SagaState | None], writes: PendingWrites, now: int) -> Outcome:
        """``_decide`` while spans are on: inside its ``saga.decide`` span, whose traceparent the commands carry."""
        message = envelope.message
        with tracing.unit_span(traceparent) as span:  # the ladder's span of this unit, for this saga
            if span.is_recording() and isinstance(message, StartSaga) and message.traceparent is None:
                # A saga started without a trace context: its trace is the one this span begins.
                message = dataclasses.replace(message, traceparent=tracing.traceparent_of(span))
            definition, decision = self._decided(envelope, message, state, now)
            sent_under = None
            if span.is_recording():
                describe_decision(span, message, decision)
                sent_under = tracing.traceparent_of(span)  # its commands' spans nest under this decision
            return self._record(envelope, decision, states, writes, now, definition, state, sent_under)

    def _decided(self, envelope: Envelope, message: IncomingMessage, state: SagaState | None,
                 now: int) -> tuple[SagaDefinition | None, Decision]:
        """The definition ``message`` is decided by, and the decision: a message that contradicts its saga is
        refused like a bad record, a saga whose definition is missing or does not fit its history quarantined."""
        definition: SagaDefinition | None = None
        try:
            definition = self._definition_of(state)
            starts = message.start() if isinstance(message, SignalSaga) else message
            if isinstance(starts, StartSaga) and (state is None or state.status is SagaStatus.REJECTED):
                definition = _start_on(self._definitions, starts)
            return definition, decide(definition, state, message, now, self._migration_target(state, message))
        except InvalidMessage as error:  # the message contradicts its saga: refused like a bad record
            return definition, decide(definition, state, RejectedRecord(saga_id=message.saga_id, saga_type=None,
                                                                        reason=_clip(str(error))), now)
        except DomainError as error:  # its definition is not deployed, or does not fit its history
            if state is None:
                raise
            self._wait_if_served_elsewhere(error, state.saga_type, state.definition_version)
            return definition, quarantine(definition, state, _clip(f"{type(error).__name__}: {error}"),
                                          envelope.message_id, now)

    def _record(self, envelope: Envelope, decision: Decision, states: dict[str, SagaState | None],
                writes: PendingWrites, now: int, definition: SagaDefinition | None,
                before: SagaState | None, sent_under: str | None = None) -> Outcome:
        message = envelope.message
        try:
            after = self._write(decision, envelope, writes, sent_under)
        except WireError as error:  # the decision cannot be written (a value over its limit): the saga stops
            if before is None:
                raise
            decision = quarantine(definition, before, _clip(f"decision not recorded: {error}"),
                                  envelope.message_id, now)
            after = self._write(decision, envelope, writes, sent_under)
        if after is not None:
            states[after.saga_id] = after
            log_decision(decision.events)
            if definition is not None and definition.searchable and isinstance(decision.events[0], SagaStarted):
                # Decoded once, by the parser that checked it; an envelope built without one is decoded here.
                record = (envelope.start_input if envelope.start_input is not None
                          else self._schemas.decode(after.input)[1])
                writes.index(after.saga_id, definition.searchable, record)
        if decision.dead_letter is None or envelope.raw is None:  # no record handed over (a test): no bytes
            return Outcome.APPLIED if decision.events else Outcome.NOTHING_TO_DO
        saga_type = message.saga_type if isinstance(message, RejectedRecord) else None
        self._park(envelope, decision.dead_letter, writes, now, saga_type)
        return Outcome.DEAD_LETTERED

    @staticmethod
    def _write(decision: Decision, envelope: Envelope, writes: PendingWrites,
               sent_under: str | None = None) -> SagaState | None:
        """Add ``decision``'s rows to ``writes``, all of them or (WireError) none; the saga's state after it.
        ``sent_under``: the traceparent its commands carry (the decision's span), else the saga's own."""
        if decision.state is not None:
            for timer_id in decision.obsolete_timers:
                writes.delete_timer(decision.state.saga_id, timer_id)
        return writes.record(decision, envelope.message_id, sent_under) if decision.events else None

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

    def _migration_target(self, state: SagaState | None, message: IncomingMessage) -> SagaDefinition | None:
        """For a Migrate lever, the version it names from this orchestrator's registry (None: not registered here,
        which the lever's refusal says)."""
        if (state is None or not isinstance(message, OperateSaga) or message.action != Lever.MIGRATE
                or message.definition_version is None):
            return None
        try:
            return self._definitions.get(state.saga_type, message.definition_version)
        except UnknownDefinition:
            return None

    def _definition_of(self, state: SagaState | None) -> SagaDefinition | None:
        if state is None or state.definition_version == 0 or state.status is SagaStatus.PURGED:
            return None
        return self._definitions.get(state.saga_type, state.definition_version)

    def _fold_onto(self, state: SagaState | None, stored: Sequence[StoredEvent]) -> SagaState | None:
        if not stored:
            return state
        events = [wire.decode_event(row.body, self._schemas) for row in stored]
        try:
            definition = self._definitions.for_history(events) if state is None else self._definition_of(state)
        except UnknownDefinition as error:
            started = state or next((e for e in events if isinstance(e, SagaStarted)), None)
            if started is not None:
                self._wait_if_served_elsewhere(error, started.saga_type, started.definition_version)
            raise
        try:
            for event in events:
                if isinstance(event, SagaMigrated) and state is not None and (
                        definition is None or definition.version < event.to_version):
                    # a cached state moves to the target here (a fold from the start took the target already)
                    definition = self._definitions.get(state.saga_type, event.to_version)
                state = apply_event(definition, state, event)
                if definition is None and state.definition_version:
                    definition = self._definition_of(state)
        except ShapeChanged as error:  # started on, or took a patch onto, a shape of its version missing here
            if definition is not None:
                self._wait_if_served_elsewhere(error, definition.saga_type, definition.version)
            raise
        return state

    def _wait_if_served_elsewhere(self, error: DomainError, saga_type: str, version: int) -> None:
        """Raise ``ServedElsewhere`` when ``error`` is a definition version missing here, or a shape of a version
        deployed here that this one lacks (``ShapeChanged``), that another member of the group serves."""
        if not isinstance(error, UnknownDefinition) or self._served_elsewhere is None:
            return
        if isinstance(error, ShapeChanged):
            if self._served_elsewhere(saga_type, version, error.fingerprint):
                raise ServedElsewhere(f"saga type {saga_type!r} version {version} of shape {error.fingerprint} is "
                                      "served by another member of the group, not here: waiting for the partitions "
                                      "to move") from error
        elif (version not in self._definitions.versions(saga_type)
              and self._served_elsewhere(saga_type, version, None)):
            raise ServedElsewhere(f"saga type {saga_type!r} version {version} is served by another member of "
                                  "the group, not here: waiting for the partitions to move") from error

    def _committed(self, settled: Settled) -> None:
        """A unit of work committed: cache the states it settled, tell ``on_commit`` (new outbox rows) and
        ``on_settled`` (what it decided)."""
        # Only states whose transaction committed: a cached state must be a prefix of the stored history.
        for state in settled.states.values():
            self._cache.pop(state.saga_id, None)
            try:
                self._cache[state.saga_id] = state
            except ValueError:  # larger than the whole cache: read again each time rather than push all out
                pass
        if self._on_commit is not None:
            self._on_commit()
        if self._on_settled is not None:
            self._on_settled(settled)


class _Messages:
    """The service's messages on the isolation ladder: grouped by saga, quarantined at its end."""

    def __init__(self, service: SagaService) -> None:
        self._service = service

    def group_of(self, envelope: Envelope) -> Hashable:
        return envelope.message.saga_id

    async def handle(self, envelopes: Sequence[Envelope]) -> list[Outcome]:
        return await self._service._in_unit(lambda uow, settled: self._service._apply(uow, envelopes, settled))

    async def isolate(self, envelope: Envelope, error: Exception) -> Outcome:
        return await self._service._in_unit(
            lambda uow, settled: self._service._quarantine_alone(uow, settled, envelope, error))


class _DueTimers:
    """Due timers on the isolation ladder, as messages are: each claimed in the unit of work that fires it."""

    def __init__(self, service: SagaService) -> None:
        self._service = service

    def group_of(self, row: TimerRow) -> Hashable:
        return row.saga_id

    async def handle(self, rows: Sequence[TimerRow]) -> list[Outcome]:
        return await self._service._in_unit(lambda uow, settled: self._service._fire(uow, settled, rows))

    async def isolate(self, row: TimerRow, error: Exception) -> Outcome:
        return await self._service._in_unit(
            lambda uow, settled: self._service._quarantine_timer(uow, settled, row, error))


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


def _start_on(definitions: DefinitionRegistry, start: StartSaga) -> SagaDefinition | None:
    """The definition ``start`` starts on; None when it may not start, which ``decide`` records as a SagaRejected
    (the door refuses such a start first, saying why: this is the same answer, asked again)."""
    try:
        return start_definition(definitions, start)
    except StartRefused:
        return None
