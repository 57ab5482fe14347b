"""What goes out of a unit of work: the decisions taken in it as rows (events, outbox rows for the commands,
the published events and the dead letters, timers, read-model rows), sent in a fixed number of statements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..outbox.dead_letter_row import dead_letter_message
from ..outbox.table import OutboxMessage
from ..schemas import wire
from ..schemas.event_types import Event, OperatorActionRefused, SagaCancelRefused
from ..schemas.headers import message_headers
from ..schemas.ids import bulk_job_of, event_message_id
from ..schemas.message_types import StepCommand, WithdrawStep
from ..schemas.records import ConsumedRecord
from ..schemas.registry import SchemaRegistry, default_registry
from ..schemas.topics import Topics
from .domain.builder import Timer
from .domain.decide import Decision
from .domain.model import trouble
from .domain.state import SagaState, SagaStatus
from .ports import SagaSummaryRow, SearchKey, StatusMark, StoredEvent, TimerRow, UnitOfWork, Writes

REFUSALS = (OperatorActionRefused, SagaCancelRefused)
"""The events of a lever that did not apply: what a bulk job counts as refused (``Writes.bulk_refusals``)."""


@dataclass
class Settled:
    """What a unit of work settled: the sagas it read, and once it committed, each one's state after it, the
    decisions taken (in order) and how many messages it dead-lettered."""

    sagas: set[str] = field(default_factory=set)
    states: dict[str, SagaState] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    dead_lettered: int = 0

    def add(self, states: dict[str, SagaState | None], writes: PendingWrites) -> None:
        """Take what one batch decided."""
        self.states.update((saga_id, state) for saga_id, state in states.items() if state is not None)
        self.decisions += writes.decisions
        self.dead_lettered += writes.dead_lettered


class Outgoing:
    """What the rows of a service's units of work are made with, made once per service rather than per
    message: the topic names (a participant's commands topic named the first time a command goes to it) and the
    schema registry their events and commands are encoded with (``default_registry()`` when none is given)."""

    def __init__(self, topics: Topics, schemas: SchemaRegistry | None = None) -> None:
        self.topics = topics
        self.schemas = schemas or default_registry()
        self.events = topics.events
        self.dlq = topics.dlq
        self._commands: dict[str, str] = {}

    def commands(self, participant: str) -> str:
        """``participant``'s commands topic."""
        topic = self._commands.get(participant)
        if topic is None:
            topic = self._commands[participant] = self.topics.commands(participant)
        return topic


class PendingWrites:
    """Everything a unit of work will write for the decisions taken in it, in decision order.

    Timers are kept by (saga_id, timer_id) with the last operation winning (None = delete), which is what
    applying the decisions one by one would have left; summaries likewise keep the latest per saga.
    ``consumer`` is how a dead letter names the service that refused the record; ``outgoing`` (or the
    ``Topics`` to make one of) what the rows are made with.
    """

    def __init__(self, outgoing: Outgoing | Topics, consumer: str = "orchestrator") -> None:
        self._out = outgoing if isinstance(outgoing, Outgoing) else Outgoing(outgoing)
        self._consumer = consumer
        self.events: list[StoredEvent] = []
        self.outbox: list[OutboxMessage] = []
        self.timers: dict[tuple[str, str], TimerRow | None] = {}
        self.summaries: dict[str, SagaSummaryRow] = {}
        self.marks: list[StatusMark] = []
        self.search_keys: list[SearchKey] = []
        self.bulk_refusals: dict[int, int] = {}
        self.decisions: list[Decision] = []
        self.dead_lettered = 0

    def delete_timer(self, saga_id: str, timer_id: str) -> None:
        """Cancel a timer (an obsolete one: deleting it is an optimisation, firing it is harmless)."""
        self.timers[(saga_id, timer_id)] = None

    def record(self, decision: Decision, causation_id: str, sent_under: str | None = None) -> SagaState:
        """Add the events, outbox rows, timers and summary of one decision that recorded events; its new state.
        Every row is encoded before any is added: a value that cannot be encoded (WireError) adds none. Its
        commands carry ``sent_under`` as their traceparent when given (the span of the decision that sent them,
        so the participants' spans are its children), its events the saga's recorded one."""
        state = decision.state
        assert state is not None
        events, outbox = self._event_rows(decision, causation_id, state.saga_type or None, state.traceparent)
        sent: list[StepCommand | WithdrawStep] = [*decision.commands, *decision.withdrawals]
        outbox += [command_message(self._out, command, causation_id, sent_under or state.traceparent)
                   for command in sent]
        job = bulk_job_of(causation_id)
        if job is not None and any(isinstance(event, REFUSALS) for event in decision.events):
            self.bulk_refusals[job] = self.bulk_refusals.get(job, 0) + 1
        self.decisions.append(decision)
        self.events += events
        self.outbox += outbox
        for timer in decision.timers:
            row = _timer_row(timer)
            self.timers[(row.saga_id, row.timer_id)] = row
        self.summaries[state.saga_id] = summary_of(state)
        return state

    def index(self, saga_id: str, fields: Sequence[str], record: Mapping[str, Any]) -> None:
        """Add the business keys of a saga that has just started: the values of its input ``record``'s
        ``fields`` (those its definition declares searchable), as text; a null value is not indexed."""
        self.search_keys += [SearchKey(saga_id, name, str(record[name])) for name in fields
                             if record.get(name) is not None]

    def record_unfolded(self, decision: Decision, causation_id: str) -> None:
        """Add the events of a decision about a saga whose history does not fold (a quarantine): their rows and
        their publication, and the read model marked QUARANTINED (there is no folded state to project)."""
        events, outbox = self._event_rows(decision, causation_id, None, None)
        self.decisions.append(decision)
        self.events += events
        self.outbox += outbox
        last = decision.events[-1]
        self.marks.append(StatusMark(saga_id=last.saga_id, status=SagaStatus.QUARANTINED.value,
                                     reason=decision.dead_letter, last_seq=last.seq, updated_at_ms=last.occurred_at))

    def _event_rows(self, decision: Decision, causation_id: str, saga_type: str | None,
                    traceparent: str | None) -> tuple[list[StoredEvent], list[OutboxMessage]]:
        events, outbox = [], []
        for event in decision.events:
            body = wire.encode_event(event, self._out.schemas)
            events.append(StoredEvent(saga_id=event.saga_id, seq=event.seq, event_type=type(event).__name__,
                                      body=body, recorded_at_ms=event.occurred_at))
            outbox.append(event_message(self._out, event, body, saga_type, causation_id, traceparent))
        return events, outbox

    def park(self, raw: ConsumedRecord, reason: str, now_ms: int, saga_id: str | None = None,
             saga_type: str | None = None) -> None:
        """Park ``raw`` on the dead-letter topic with ``reason`` and its original bytes."""
        self.outbox.append(dead_letter_message(self._out.dlq, raw, reason=reason, consumer=self._consumer,
                                               now_ms=now_ms, saga_id=saga_id, saga_type=saga_type))
        self.dead_lettered += 1

    async def flush(self, uow: UnitOfWork) -> None:
        """Write everything, in one ``UnitOfWork.write``.

        Rows that other transactions may also lock (events, timers, summaries of the same saga) go in
        saga order, so two multi-saga transactions wait for each other in one direction only (no
        deadlock). Outbox rows keep decision order: that order is the publishing order.
        """
        if not (self.timers or self.events or self.outbox or self.summaries or self.marks or self.search_keys):
            return
        await uow.write(Writes(
            deleted_timers=sorted(key for key, row in self.timers.items() if row is None),
            events=sorted(self.events, key=lambda e: (e.saga_id, e.seq)),
            outbox=self.outbox,
            timers=[row for _, row in sorted(self.timers.items()) if row is not None],
            summaries=[self.summaries[saga_id] for saga_id in sorted(self.summaries)],
            marks=sorted(self.marks, key=lambda mark: mark.saga_id),
            search_keys=sorted(self.search_keys, key=lambda key: (key.field, key.value, key.saga_id)),
            bulk_refusals=dict(sorted(self.bulk_refusals.items())),
        ))


def event_message(outgoing: Outgoing, event: Event, body: bytes, saga_type: str | None,
                  causation_id: str, traceparent: str | None = None) -> OutboxMessage:
    """The outbox row that publishes ``event`` on saga.events."""
    message_id = event_message_id(event.saga_id, event.seq)
    return OutboxMessage(topic=outgoing.events, key=event.saga_id, value=body,
                         headers=message_headers(message_id, causation_id=causation_id, saga_id=event.saga_id,
                                                 saga_type=saga_type, traceparent=traceparent),
                         message_id=message_id)


def command_message(outgoing: Outgoing, command: StepCommand | WithdrawStep, causation_id: str,
                    traceparent: str | None = None) -> OutboxMessage:
    """The outbox row that sends ``command`` (or a withdrawal) to its participant's commands topic."""
    value = (wire.encode_withdraw(command, outgoing.schemas) if isinstance(command, WithdrawStep)
             else wire.encode_command(command, outgoing.schemas))
    return OutboxMessage(topic=outgoing.commands(command.participant), key=command.saga_id, value=value,
                         headers=message_headers(command.message_id, causation_id=causation_id,
                                                 saga_id=command.saga_id, saga_type=command.saga_type,
                                                 traceparent=traceparent),
                         message_id=command.message_id)


def _timer_row(timer: Timer) -> TimerRow:
    return TimerRow(saga_id=timer.saga_id, timer_id=timer.timer_id, kind=str(timer.kind), step=timer.step,
                    attempt=timer.attempt, due_at_ms=timer.due_at)


def summary_of(state: SagaState) -> SagaSummaryRow:
    """The saga_summary row (read model) of a saga in ``state``."""
    stuck = trouble(state)
    return SagaSummaryRow(
        saga_id=state.saga_id, saga_type=state.saga_type, tenant_id=state.tenant_id, status=state.status.value,
        started_at_ms=state.started_at, updated_at_ms=state.updated_at, last_seq=state.last_seq,
        failed_step=state.failed_step or state.compensation_failed_step, reason=state.reason,
        current_step=None if stuck is None else stuck.step, step_failures=0 if stuck is None else stuck.failures,
        last_error=None if stuck is None else stuck.error,
        definition_version=state.definition_version or None, definition_fingerprint=state.definition_fingerprint,
    )
