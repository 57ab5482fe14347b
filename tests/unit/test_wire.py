"""The wire adapter: domain dataclasses <-> single-object Avro, and its agreement with the schemas."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest

from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.codec import WrongSchema
from saga_orchestrator.schemas.event_types import EVENT_TYPES, Event, SagaCompletedWithFailures, StepSucceeded
from saga_orchestrator.schemas.message_types import (
    CancelSaga,
    CommandKind,
    DeadLetter,
    OperateSaga,
    ResultStatus,
    ResumeCompensation,
    StartSaga,
    StepCommand,
    StepResult,
    WithdrawStep,
)
from saga_orchestrator.schemas.registry import default_registry

REGISTRY = default_registry()

_SAMPLES: dict[Any, Any] = {
    str: "text",
    int: 7,
    bool: True,
    bytes: b"\x00\xff",
    str | None: "maybe",
    int | None: 1_800_000_002_000,
    bytes | None: b"out",
    tuple[str, ...]: ("flight", "hotel"),
    tuple[tuple[str, bytes], ...]: (("book_flight", b'{"booking_id": 1}'), ("book_hotel", b"\x00")),
    CommandKind: CommandKind.FORWARD,
    ResultStatus: ResultStatus.SUCCEEDED,
}


def sample(cls: type[Any], **overrides: Any) -> Any:
    """An instance of a dataclass with a plausible value in every field."""
    hints = typing.get_type_hints(cls)
    values = {f.name: _SAMPLES[hints[f.name]] for f in dataclasses.fields(cls)}
    return cls(**{**values, **overrides})


def avro_fields(full_name: str) -> list[str]:
    return [field["name"] for field in REGISTRY.schema(full_name).schema["fields"]]


def avro_symbols(full_name: str, field_name: str) -> list[str]:
    (field,) = [f for f in REGISTRY.schema(full_name).schema["fields"] if f["name"] == field_name]
    return list(field["type"]["symbols"])


def field_names(cls: type[Any]) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


# --- the dataclasses and the schemas agree -------------------------------------------------------------


def test_every_event_schema_has_a_class_and_every_class_a_schema() -> None:
    assert set(REGISTRY.names("events")) == wire.EVENT_SCHEMAS


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_event_fields_equal_avro_fields(name: str) -> None:
    assert field_names(EVENT_TYPES[name]) == avro_fields(f"saga.v1.events.{name}")


@pytest.mark.parametrize(
    ("cls", "full_name", "outside_the_body"),
    [
        (StartSaga, wire.START_SAGA, ["traceparent"]),  # a header
        (CancelSaga, wire.CANCEL_SAGA, []),
        (ResumeCompensation, wire.RESUME_COMPENSATION, []),
        (OperateSaga, wire.OPERATE_SAGA, []),
        (StepResult, wire.STEP_RESULT, []),
        (StepCommand, wire.STEP_COMMAND, ["participant", "message_id"]),
        (DeadLetter, wire.DEAD_LETTER, []),
    ],
)
def test_message_fields_equal_avro_fields(
    cls: type[Any], full_name: str, outside_the_body: list[str]
) -> None:
    assert sorted(field_names(cls)) == sorted(avro_fields(full_name) + outside_the_body)


def test_enum_symbols_equal_avro_symbols() -> None:
    assert [k.value for k in CommandKind] == avro_symbols(wire.STEP_COMMAND, "kind")
    assert [s.value for s in ResultStatus] == avro_symbols(wire.STEP_RESULT, "status")


# --- events ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", list(EVENT_TYPES.values()), ids=list(EVENT_TYPES))
def test_every_event_round_trips(cls: type[Event]) -> None:
    event = sample(cls)
    data = wire.encode_event(event)
    assert wire.decode_event(data) == event
    assert wire.event_type_name(event) == cls.__name__
    assert REGISTRY.decode(data)[0] == wire.event_schema_name(event) == f"saga.v1.events.{cls.__name__}"


def test_failed_steps_come_back_as_a_tuple() -> None:
    event = sample(SagaCompletedWithFailures, failed_steps=("a", "b"))
    decoded = wire.decode_event(wire.encode_event(event))
    assert isinstance(decoded, SagaCompletedWithFailures) and decoded.failed_steps == ("a", "b")


def test_optional_event_fields_may_be_empty() -> None:
    event = sample(StepSucceeded, output=None)
    assert wire.decode_event(wire.encode_event(event)) == event


# --- messages -------------------------------------------------------------------------------------------


def test_start_cancel_and_resume_round_trip() -> None:
    start = sample(StartSaga, tenant_id=None, traceparent=None,  # the trace context is a header, not the body
                   definition_version=2)
    cancel = sample(CancelSaga)
    resume = sample(ResumeCompensation, operator=None)
    assert wire.decode_start(wire.encode_start(start)) == start
    assert wire.decode_cancel(wire.encode_cancel(cancel)) == cancel
    assert wire.decode_resume(wire.encode_resume(resume)) == resume
    with pytest.raises(WrongSchema):
        wire.decode_resume(wire.encode_cancel(cancel))


def test_a_command_travels_without_participant_and_message_id() -> None:
    command = sample(StepCommand, kind=CommandKind.COMPENSATE)
    data = wire.encode_command(command)
    _, record = REGISTRY.decode(data)
    assert "participant" not in record and "message_id" not in record and record["kind"] == "COMPENSATE"
    decoded = wire.decode_command(data, participant=command.participant, message_id=command.message_id)
    assert decoded == command and type(decoded.kind) is CommandKind


def test_a_withdrawal_travels_on_the_commands_topic_beside_the_commands() -> None:
    withdrawal = sample(WithdrawStep)
    data = wire.encode_withdraw(withdrawal)
    _, record = REGISTRY.decode(data)
    assert "participant" not in record and "message_id" not in record
    decoded = wire.decode_participant_command(data, participant=withdrawal.participant,
                                              message_id=withdrawal.message_id)
    assert decoded == withdrawal
    command = sample(StepCommand, kind=CommandKind.FORWARD)
    assert wire.decode_participant_command(wire.encode_command(command), participant=command.participant,
                                           message_id=command.message_id) == command
    with pytest.raises(WrongSchema):  # a participant that reads only StepCommand refuses it
        wire.decode_command(data, participant=withdrawal.participant, message_id=withdrawal.message_id)


def test_a_failed_result_round_trips_with_typed_enums() -> None:
    result = sample(StepResult, kind=CommandKind.FORWARD, status=ResultStatus.FAILED, output=None)
    decoded = wire.decode_result(wire.encode_result(result))
    assert decoded == result and decoded.status is ResultStatus.FAILED


def test_incoming_messages_are_checked_against_their_topic() -> None:
    start, cancel = sample(StartSaga, traceparent=None, definition_version=2), sample(CancelSaga)
    result = sample(StepResult, kind=CommandKind.FORWARD, status=ResultStatus.SUCCEEDED)
    assert wire.decode_incoming("start", wire.encode_start(start)) == start
    assert wire.decode_incoming("control", wire.encode_cancel(cancel)) == cancel
    resume = sample(ResumeCompensation)
    assert wire.decode_incoming("control", wire.encode_resume(resume)) == resume
    operate = sample(OperateSaga, definition_version=2)  # an Avro int
    assert wire.decode_incoming("control", wire.encode_operate(operate)) == operate
    assert wire.decode_operate(wire.encode_operate(operate)) == operate
    assert wire.decode_incoming("results", wire.encode_result(result)) == result
    with pytest.raises(WrongSchema):
        wire.decode_incoming("results", wire.encode_start(start))
    with pytest.raises(ValueError, match="unknown topic kind"):
        wire.decode_incoming("events", b"")  # type: ignore[arg-type]


# --- inputs and dead letters ----------------------------------------------------------------------------

TRIP = "saga.v1.trip.TripRequest"


def test_a_saga_input_round_trips() -> None:
    trip = {name: "x" for name in avro_fields(TRIP)} | {"amount_cents": 12_345}
    data = wire.encode_input(TRIP, trip)
    assert wire.decode_input(data) == (TRIP, trip)
    assert wire.decode_input(data, TRIP) == (TRIP, trip)
    with pytest.raises(WrongSchema):
        wire.decode_input(wire.encode_cancel(sample(CancelSaga)))
    with pytest.raises(WrongSchema):
        wire.encode_input(wire.CANCEL_SAGA, {"saga_id": "s", "reason": "r"})


def test_a_dead_letter_round_trips() -> None:
    letter = DeadLetter(
        source_topic="saga.start",
        source_partition=3,
        source_offset=42,
        consumer="orchestrator",
        reason="not an Avro single-object value",
        failed_at=1_700_000_000_000,
        saga_id="s-1",
        original_key=b"s-1",
        original_value=b"junk",
        original_headers=(("message_id", b"m-1"), ("empty", None)),
    )
    assert wire.decode_dead_letter(wire.encode_dead_letter(letter)) == letter
    assert letter.message_id == "dlq:saga.start:3:42"


def test_a_dead_letter_drops_an_original_value_too_large_to_carry() -> None:
    size = REGISTRY.max_value_size
    letter = DeadLetter(
        source_topic="t", source_partition=0, source_offset=1, consumer="c", reason="too big",
        failed_at=0, original_value=bytes(size),
    )  # fmt: skip
    decoded = wire.decode_dead_letter(wire.encode_dead_letter(letter))
    assert decoded.original_value is None
    assert decoded.reason == f"too big (original value of {size} bytes not kept: too large)"
