"""The one encoder and the one decoder of every message of the contract: dataclasses <-> single-object Avro.

Dataclass field names equal Avro field names, so the mapping is mechanical; this module only converts
what Avro cannot carry as such (StrEnum <-> enum symbol, tuple <-> array) and drops the fields that
travel outside the body (a command's participant is its topic, its message id a header).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal, TypeVar

from .codec import MalformedBody, ValueTooLarge, WrongSchema
from .event_types import EVENT_TYPES, Event
from .limits import DEAD_LETTER_MAX_BYTES, MAX_DEAD_LETTER_REASON_CHARS, id_problem
from .message_types import (
    CancelSaga,
    CommandKind,
    ControlCommand,
    DeadLetter,
    OperateSaga,
    ReleaseSaga,
    ResultStatus,
    ResumeCompensation,
    SignalSaga,
    StartSaga,
    StepCommand,
    StepResult,
    WithdrawStep,
)
from .records import printable_header_name
from .registry import SchemaRegistry, default_registry

EVENTS_NAMESPACE = "saga.v1.events"
START_SAGA = "saga.v1.StartSaga"
CANCEL_SAGA = "saga.v1.CancelSaga"
RESUME_COMPENSATION = "saga.v1.ResumeCompensation"
RELEASE_SAGA = "saga.v1.ReleaseSaga"
OPERATE_SAGA = "saga.v1.OperateSaga"
SIGNAL_SAGA = "saga.v1.SignalSaga"
STEP_COMMAND = "saga.v1.StepCommand"
STEP_RESULT = "saga.v1.StepResult"
WITHDRAW_STEP = "saga.v1.WithdrawStep"
DEAD_LETTER = "saga.v1.DeadLetter"
INPUTS_FOLDER = "inputs"

EVENT_SCHEMAS: frozenset[str] = frozenset(f"{EVENTS_NAMESPACE}.{name}" for name in EVENT_TYPES)
"""Full Avro names of every event type the domain knows."""

TopicKind = Literal["start", "control", "results"]
IncomingWire = StartSaga | CancelSaga | ResumeCompensation | ReleaseSaga | OperateSaga | SignalSaga | StepResult

T = TypeVar("T")
E = TypeVar("E", CommandKind, ResultStatus)


_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {}


def _field_names(cls: type[Any]) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(field.name for field in dataclasses.fields(cls))
    return names


def _record(obj: Any, exclude: Collection[str] = ()) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in _field_names(type(obj)) if name not in exclude}


def _build(cls: Callable[..., T], name: str, values: Mapping[str, Any]) -> T:
    """Construct a dataclass from a decoded record; a shape mismatch is a bad message, not a crash."""
    try:
        return cls(**values)
    except (TypeError, ValueError) as error:
        raise MalformedBody(f"{name} does not fit {getattr(cls, '__name__', cls)}: {error}") from error


def _symbol(enum: type[E], value: Any, name: str) -> E:
    """Map an Avro enum symbol to the domain StrEnum (both list the same symbols; a test checks it)."""
    try:
        return enum(value)
    except ValueError as error:
        raise MalformedBody(f"{name}: {value!r} is not a {enum.__name__}") from error


# --- events -------------------------------------------------------------------------------------------


def event_type_name(event: Event) -> str:
    """The event's record name (``SagaStarted``), as stored in the event table's ``event_type``."""
    return type(event).__name__


def event_schema_name(event: Event) -> str:
    """The event's full Avro name (``saga.v1.events.SagaStarted``)."""
    return f"{EVENTS_NAMESPACE}.{type(event).__name__}"


def encode_event(event: Event, schemas: SchemaRegistry | None = None) -> bytes:
    """Single-object encode a saga event with its schema from ``schemas/events`` (of ``schemas``, a caller's
    registry looked up once; else ``default_registry()``)."""
    record = _record(event)
    for key, value in record.items():
        if isinstance(value, tuple):
            record[key] = list(value)  # Avro arrays; fastavro could read a tuple as a union tag
    return (schemas or default_registry()).encode(event_schema_name(event), record)


def decode_event(data: bytes, schemas: SchemaRegistry | None = None) -> Event:
    """Decode any saga event (with ``schemas``, else ``default_registry()``); raises WrongSchema for a value
    that is not an event."""
    name, record = (schemas or default_registry()).decode_as(data, EVENT_SCHEMAS)
    cls = EVENT_TYPES[name.rpartition(".")[2]]
    known = _field_names(cls)
    values = {key: tuple(v) if isinstance(v, list) else v for key, v in record.items() if key in known}
    return _build(cls, name, values)


# --- saga.start / saga.control ------------------------------------------------------------------------


def encode_start(message: StartSaga) -> bytes:
    """Encode a StartSaga command for topic saga.start, with the released schema an orchestrator of that release
    reads when the start names no version (``SchemaRegistry.encode_oldest``)."""
    return default_registry().encode_oldest(START_SAGA, _record(message, exclude=("traceparent",)))


def _start_from(record: dict[str, Any]) -> StartSaga:
    return _build(StartSaga, START_SAGA, record)


def decode_start(data: bytes, schemas: SchemaRegistry | None = None) -> StartSaga:
    """Decode a StartSaga command."""
    return _start_from((schemas or default_registry()).decode_as(data, START_SAGA)[1])


def encode_cancel(message: CancelSaga) -> bytes:
    """Encode a CancelSaga command for topic saga.control."""
    return default_registry().encode(CANCEL_SAGA, _record(message))


def _cancel_from(record: dict[str, Any]) -> CancelSaga:
    return _build(CancelSaga, CANCEL_SAGA, record)


def decode_cancel(data: bytes) -> CancelSaga:
    """Decode a CancelSaga command."""
    return _cancel_from(default_registry().decode_as(data, CANCEL_SAGA)[1])


def encode_resume(message: ResumeCompensation) -> bytes:
    """Encode an operator's ResumeCompensation for topic saga.control."""
    return default_registry().encode(RESUME_COMPENSATION, _record(message))


def _resume_from(record: dict[str, Any]) -> ResumeCompensation:
    return _build(ResumeCompensation, RESUME_COMPENSATION, record)


def decode_resume(data: bytes) -> ResumeCompensation:
    """Decode a ResumeCompensation command."""
    return _resume_from(default_registry().decode_as(data, RESUME_COMPENSATION)[1])


def encode_release(message: ReleaseSaga) -> bytes:
    """Encode an operator's ReleaseSaga for topic saga.control."""
    return default_registry().encode(RELEASE_SAGA, _record(message))


def _release_from(record: dict[str, Any]) -> ReleaseSaga:
    return _build(ReleaseSaga, RELEASE_SAGA, record)


def decode_release(data: bytes) -> ReleaseSaga:
    """Decode a ReleaseSaga command."""
    return _release_from(default_registry().decode_as(data, RELEASE_SAGA)[1])


def encode_operate(message: OperateSaga) -> bytes:
    """Encode an operator's OperateSaga (a lever) for topic saga.control; a lever that names no definition version
    (every one but Migrate) with the released schema an orchestrator of that release reads."""
    return default_registry().encode_oldest(OPERATE_SAGA, _record(message))


def encode_control(message: ControlCommand) -> bytes:
    """Encode any command for topic saga.control, with its own encoder."""
    if isinstance(message, CancelSaga):
        return encode_cancel(message)
    if isinstance(message, ResumeCompensation):
        return encode_resume(message)
    if isinstance(message, ReleaseSaga):
        return encode_release(message)
    return encode_operate(message)


def _operate_from(record: dict[str, Any]) -> OperateSaga:
    return _build(OperateSaga, OPERATE_SAGA, record)


def decode_operate(data: bytes) -> OperateSaga:
    """Decode an OperateSaga command."""
    return _operate_from(default_registry().decode_as(data, OPERATE_SAGA)[1])


def encode_signal(message: SignalSaga) -> bytes:
    """Encode a SignalSaga for topic saga.control."""
    return default_registry().encode(SIGNAL_SAGA, _record(message))


def _signal_from(record: dict[str, Any]) -> SignalSaga:
    return _build(SignalSaga, SIGNAL_SAGA, record)


def decode_signal(data: bytes) -> SignalSaga:
    """Decode a SignalSaga."""
    return _signal_from(default_registry().decode_as(data, SIGNAL_SAGA)[1])


# --- participant commands and results -----------------------------------------------------------------


def encode_result(result: StepResult) -> bytes:
    """Encode a participant's StepResult for topic <participant>.results."""
    record = _record(result)
    record["kind"] = result.kind.value
    record["status"] = result.status.value
    return default_registry().encode(STEP_RESULT, record)


def _result_from(record: dict[str, Any]) -> StepResult:
    record["kind"] = _symbol(CommandKind, record["kind"], STEP_RESULT)
    record["status"] = _symbol(ResultStatus, record["status"], STEP_RESULT)
    return _build(StepResult, STEP_RESULT, record)


def decode_result(data: bytes) -> StepResult:
    """Decode a StepResult; ``kind`` and ``status`` come back as CommandKind and ResultStatus."""
    return _result_from(default_registry().decode_as(data, STEP_RESULT)[1])


def encode_command(command: StepCommand, schemas: SchemaRegistry | None = None) -> bytes:
    """Encode a StepCommand for topic <participant>.commands.

    ``participant`` (the topic) and ``message_id`` (a header) are not part of the Avro record.
    """
    record = _record(command, exclude=("participant", "message_id"))
    record["kind"] = command.kind.value
    record["step_outputs"] = dict(command.step_outputs)
    return (schemas or default_registry()).encode(STEP_COMMAND, record)


def decode_command(data: bytes, *, participant: str, message_id: str) -> StepCommand:
    """Decode a StepCommand; the caller supplies what travels outside the body (topic, header)."""
    record = default_registry().decode_as(data, STEP_COMMAND)[1]
    return _command_from(record, participant, message_id)


def _command_from(record: dict[str, Any], participant: str, message_id: str) -> StepCommand:
    record["kind"] = _symbol(CommandKind, record["kind"], STEP_COMMAND)
    record["step_outputs"] = tuple(sorted(record.get("step_outputs", {}).items()))
    return _build(StepCommand, STEP_COMMAND, {**record, "participant": participant, "message_id": message_id})


def encode_withdraw(withdrawal: WithdrawStep, schemas: SchemaRegistry | None = None) -> bytes:
    """Encode a WithdrawStep for topic <participant>.commands (``participant`` and ``message_id`` travel outside
    the body)."""
    record = _record(withdrawal, exclude=("participant", "message_id"))
    return (schemas or default_registry()).encode(WITHDRAW_STEP, record)


def decode_participant_command(data: bytes, *, participant: str, message_id: str) -> StepCommand | WithdrawStep:
    """Decode what a participant's commands topic carries: a StepCommand or a WithdrawStep."""
    name, record = default_registry().decode_as(data, frozenset({STEP_COMMAND, WITHDRAW_STEP}))
    if name == STEP_COMMAND:
        return _command_from(record, participant, message_id)
    return _build(WithdrawStep, WITHDRAW_STEP, {**record, "participant": participant, "message_id": message_id})


_TOPIC_SCHEMAS: dict[str, frozenset[str]] = {
    "start": frozenset({START_SAGA}),
    "control": frozenset({CANCEL_SAGA, RESUME_COMPENSATION, RELEASE_SAGA, OPERATE_SAGA, SIGNAL_SAGA}),
    "results": frozenset({STEP_RESULT}),
}
_INCOMING: dict[str, Callable[[dict[str, Any]], IncomingWire]] = {
    START_SAGA: _start_from,
    CANCEL_SAGA: _cancel_from,
    RESUME_COMPENSATION: _resume_from,
    RELEASE_SAGA: _release_from,
    OPERATE_SAGA: _operate_from,
    SIGNAL_SAGA: _signal_from,
    STEP_RESULT: _result_from,
}


def decode_incoming(topic_kind: TopicKind, data: bytes) -> IncomingWire:
    """Decode a message the orchestrator consumes, checking it is the one its topic carries:
    ``start`` -> StartSaga, ``control`` -> CancelSaga, ResumeCompensation, ReleaseSaga, OperateSaga or SignalSaga,
    ``results`` -> StepResult."""
    try:
        expected = _TOPIC_SCHEMAS[topic_kind]
    except KeyError:
        raise ValueError(f"unknown topic kind {topic_kind!r}") from None
    name, record = default_registry().decode_as(data, expected)
    return _INCOMING[name](record)


# --- saga inputs --------------------------------------------------------------------------------------


def _input_names() -> list[str]:
    return default_registry().names(INPUTS_FOLDER)


def encode_input(full_name: str, record: Mapping[str, Any]) -> bytes:
    """Encode a saga input record (a schema in an ``inputs/`` folder of the registry, e.g. saga.v1.trip.TripRequest)."""
    inputs = _input_names()
    if full_name not in inputs:
        raise WrongSchema(full_name, frozenset(inputs))
    return default_registry().encode(full_name, record)


def decode_input(data: bytes, expected: str | None = None) -> tuple[str, dict[str, Any]]:
    """Decode a saga input; ``expected`` (a full name) narrows it to one saga type's input schema."""
    return default_registry().decode_as(data, _input_names() if expected is None else expected)


# --- dead letters -------------------------------------------------------------------------------------


def encode_dead_letter(letter: DeadLetter, registry: SchemaRegistry | None = None,
                       max_size: int = DEAD_LETTER_MAX_BYTES) -> bytes:
    """Encode a dead letter for topic saga.dlq, never larger than ``max_size``.

    What does not fit is dropped, and the reason says so, rather than losing the whole letter (the source
    topic, partition and offset still locate the original): first the original value, then the original
    key and headers. A saga id that is no usable id is left out.
    """
    registry = registry or default_registry()
    record = _record(letter)
    record["reason"] = letter.reason[:MAX_DEAD_LETTER_REASON_CHARS]
    if letter.saga_id is not None and id_problem(letter.saga_id, "saga_id"):
        record["saga_id"] = None
    record["original_headers"] = [{"key": printable_header_name(k), "value": v} for k, v in letter.original_headers]
    size = 0
    for shed in ("nothing", "value", "key and headers"):
        if shed == "value" and letter.original_value is not None:
            record["original_value"] = None
            record["reason"] += f" (original value of {len(letter.original_value)} bytes not kept: too large)"
        elif shed == "key and headers":
            record["original_key"] = None
            record["original_headers"] = []
            record["reason"] += " (original key and headers not kept: too large)"
        try:
            data = registry.encode(DEAD_LETTER, record)
        except ValueTooLarge as error:
            size = error.size
            continue
        if len(data) <= max_size:
            return data
        size = len(data)
    raise ValueTooLarge(size, max_size, "dead letter without its original record")


def decode_dead_letter(data: bytes) -> DeadLetter:
    """Decode a dead letter."""
    record = default_registry().decode_as(data, DEAD_LETTER)[1]
    record["original_headers"] = tuple((h["key"], h["value"]) for h in record["original_headers"])
    return _build(DeadLetter, DEAD_LETTER, record)
