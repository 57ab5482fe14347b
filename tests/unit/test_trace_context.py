"""W3C trace context: the traceparent a StartSaga came with travels on every message of its saga."""

from __future__ import annotations

import pytest

from saga_orchestrator.orchestrator.domain.decide import decide
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry
from saga_orchestrator.orchestrator.domain.state import fold
from saga_orchestrator.orchestrator.inbound import Envelope, RecordParser
from saga_orchestrator.orchestrator.outbound import PendingWrites
from saga_orchestrator.participants.kit.deliveries import parse_delivery
from saga_orchestrator.participants.kit.ledger import RecordedReply
from saga_orchestrator.participants.kit.replies import step_result_message
from saga_orchestrator.participants.registry import get_participant
from saga_orchestrator.participants.trip import PARTICIPANTS
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import SagaStarted
from saga_orchestrator.schemas.headers import valid_traceparent
from saga_orchestrator.schemas.message_types import StartSaga
from saga_orchestrator.schemas.records import ConsumedRecord
from saga_orchestrator.schemas.registry import default_registry
from saga_orchestrator.schemas.topics import Topics

TOPICS = Topics()
TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
FLIGHT = get_participant("flight")


@pytest.mark.parametrize(("value", "kept"), [
    (TRACE, True),
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),  # an all-zero trace id is invalid
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),  # so is an all-zero parent id
    ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),  # version ff is forbidden
    ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", False),  # upper case is not W3C
    ("not a trace", False),
    (None, False),
])
def test_only_a_w3c_traceparent_is_kept(value: str | None, kept: bool) -> None:
    assert valid_traceparent(value) == (value if kept else None)


def _start_record(traceparent: bytes) -> ConsumedRecord:
    start = SCENARIOS["happy"].start("t-trace")
    return ConsumedRecord(topic=TOPICS.start, partition=0, offset=1, key=b"t-trace", value=wire.encode_start(start),
                     headers=(("message_id", b"m-1"), ("traceparent", traceparent)))


def test_the_orchestrator_passes_the_starts_trace_context_to_every_event_and_command() -> None:
    parser = RecordParser(TOPICS, DefinitionRegistry([TRIP]), default_registry(), PARTICIPANTS)
    envelope = parser.parse(_start_record(TRACE.encode()))
    assert isinstance(envelope, Envelope) and isinstance(envelope.message, StartSaga)
    assert envelope.message.traceparent == TRACE
    decision = decide(TRIP, None, envelope.message, 1_000)
    started = decision.events[0]
    assert isinstance(started, SagaStarted) and started.traceparent == TRACE
    assert fold(TRIP, decision.events).traceparent == TRACE
    assert wire.decode_event(wire.encode_event(started)) == started
    writes = PendingWrites(TOPICS)
    writes.record(decision, envelope.message_id)
    assert {row.topic for row in writes.outbox} == {TOPICS.events, TOPICS.commands("flight"), TOPICS.commands("hotel")}
    assert all(row.headers["traceparent"] == TRACE for row in writes.outbox)


def test_an_unusable_trace_context_is_dropped_and_the_saga_runs_without_one() -> None:
    parser = RecordParser(TOPICS, DefinitionRegistry([TRIP]), default_registry(), PARTICIPANTS)
    envelope = parser.parse(_start_record(b"garbage"))
    assert isinstance(envelope, Envelope) and isinstance(envelope.message, StartSaga)
    assert envelope.message.traceparent is None
    writes = PendingWrites(TOPICS)
    writes.record(decide(TRIP, None, envelope.message, 1_000), envelope.message_id)
    assert not any("traceparent" in row.headers for row in writes.outbox)


def test_a_participant_answers_with_the_commands_trace_context() -> None:
    writes = PendingWrites(TOPICS)
    start = StartSaga(saga_id="t-trace", saga_type="trip", tenant_id=None,
                      input=SCENARIOS["happy"].start("t-trace").input, traceparent=TRACE)
    writes.record(decide(TRIP, None, start, 1_000), "m-1")
    command_row = next(row for row in writes.outbox if row.topic == TOPICS.commands("flight"))
    headers = [(name, value.encode()) for name, value in command_row.headers.items()]
    parsed = parse_delivery(FLIGHT, ConsumedRecord(topic=command_row.topic, key=b"t-trace",
                                                   value=command_row.value, headers=tuple(headers)))
    assert parsed.command is not None and parsed.command.traceparent == TRACE
    reply = step_result_message(parsed.command, TOPICS.results("flight"),
                                RecordedReply("SUCCEEDED", None, None, None))
    assert reply.headers["traceparent"] == TRACE
