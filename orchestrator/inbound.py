"""What comes in, as messages for the core: every consumed record becomes one (a record that is no acceptable
message becomes a RejectedRecord, with the reason a human can act on), and so does every due timer."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..schemas import wire
from ..schemas.codec import WireError
from ..schemas.headers import MESSAGE_ID, TRACEPARENT, valid_traceparent
from ..schemas.ids import compensation_key, forward_key, reply_message_id
from ..schemas.limits import (
    MAX_ERROR_MESSAGE_CHARS,
    MAX_MESSAGE_ID_BYTES,
    MAX_REJECTION_REASON_CHARS,
    MAX_START_SAGA_BYTES,
    MAX_TEXT_CHARS,
    clip_text,
    id_problem,
    nul_field,
)
from ..schemas.message_types import (
    CancelSaga,
    CommandKind,
    OperateSaga,
    ReleaseSaga,
    ResumeCompensation,
    SignalSaga,
    StartSaga,
    StepResult,
)
from ..schemas.records import ConsumedRecord
from ..schemas.registry import SchemaRegistry
from ..schemas.topics import Topics
from .domain.builder import Timer, TimerKind
from .domain.definition import DefinitionRegistry
from .domain.errors import StartRefused
from .domain.messages import IncomingMessage, RejectedRecord, TimerFired
from .domain.starting import start_definition
from .ports import InboxKey, TimerRow

T = TypeVar("T")

CLIENT_IDS = "orchestrator"
"""Inbox namespace of the ``message_id`` headers clients give their records (saga.start, saga.control)."""
CONTENT_IDS = "orchestrator:content"
"""Inbox namespace of the records that come without a ``message_id`` header: a digest of their content."""
REPLY_IDS = "orchestrator:reply"
"""Inbox namespace of the participants' replies: the id their idempotency key and attempt derive (the header
is not trusted for it)."""
REJECTED_IDS = "orchestrator:rejected"
"""Inbox namespace of the records refused at the door: their position and a digest of their content."""


@dataclass(frozen=True)
class Envelope:
    """A message for the core, with the key the inbox dedupes it on (None: no inbox claim, as for a timer,
    whose row claim is its dedupe), the id its effects name as their cause, and the record it came from (None
    for a timer), which a dead letter keeps whole."""

    message: IncomingMessage
    message_id: str
    raw: ConsumedRecord | None = None
    inbox_key: InboxKey | None = None
    start_input: Mapping[str, Any] | None = None
    """The input record of the saga the message starts (a StartSaga's, a signal-with-start's), decoded once
    where the parser checked it; the service indexes the saga's business keys from it. None for every other
    message, and for an envelope built without the parser (the service then decodes the input itself)."""


def timer_envelope(row: TimerRow) -> Envelope:
    """A due timer as a message. It is claimed by deleting its row (``UnitOfWork.claim_due``), which makes a
    second firing (another instance, a crash) impossible, so it takes no inbox id a client could forge."""
    timer = Timer(saga_id=row.saga_id, kind=TimerKind(row.kind), step=row.step, attempt=row.attempt,
                  due_at=row.due_at_ms)
    return Envelope(message=TimerFired(timer=timer), message_id=f"timer:{row.saga_id}:{row.timer_id}")


def content_digest(raw: ConsumedRecord) -> str:
    """A digest of what a record says (topic, key, value): the same for every copy of it, wherever it lands."""
    digest = hashlib.sha256()
    for part in (raw.topic.encode(), raw.key or b"", raw.value or b""):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()[:32]


class RecordParser:
    """Reads records against the wire contract of the topic they arrived on."""

    def __init__(self, topics: Topics, definitions: DefinitionRegistry, registry: SchemaRegistry,
                 participants: tuple[str, ...]) -> None:
        self._topics = topics
        self._start_topic, self._control_topic = topics.start, topics.control  # named once, read per record
        self._definitions = definitions
        self._registry = registry
        self._results_topics = {topics.results(p) for p in participants}

    def topic_names(self) -> list[str]:
        """Every topic the orchestrator consumes."""
        return [self._topics.start, self._topics.control, *sorted(self._results_topics)]

    def result_topic_names(self) -> frozenset[str]:
        """The participants' results topics among them."""
        return frozenset(self._results_topics)

    def parse(self, raw: ConsumedRecord) -> Envelope:
        """The message ``raw`` carries, or a RejectedRecord saying why it carries none; never raises for bad
        input. Its inbox key: a client's message by its ``message_id`` header (by its content without one), a
        reply by its idempotency key and attempt, a rejected record by its position and content."""
        parsed = self._parse(raw)
        message = parsed.message
        if isinstance(message, RejectedRecord) and len(message.reason) > MAX_REJECTION_REASON_CHARS:
            # A reason quotes ids and decoder errors; it goes into an event and a dead letter, so keep it small.
            message = dataclasses.replace(message, reason=message.reason[:MAX_REJECTION_REASON_CHARS] + "...")
            return dataclasses.replace(parsed, message=message)
        return parsed

    def _parse(self, raw: ConsumedRecord) -> Envelope:
        key = _key_text(raw.key)
        # Only an id the stores can key on may receive a SagaRejected event.
        key_id = key if key is not None and id_problem(key, "key") is None else None

        def rejected(reason: str, saga_id: str | None, saga_type: str | None = None) -> Envelope:
            return Envelope(RejectedRecord(saga_id=saga_id, saga_type=saga_type, reason=reason), raw.position_id,
                            raw, (REJECTED_IDS, f"{raw.position_id}:{content_digest(raw)}"))

        unreadable = raw.unreadable
        if unreadable is not None:
            return rejected(unreadable, key_id)
        if raw.value is None:
            return rejected("empty value (tombstone) where a saga message was expected", key_id)
        message_id = raw.header(MESSAGE_ID)
        if message_id is not None:
            problem = id_problem(message_id, "message_id header", MAX_MESSAGE_ID_BYTES)
            if problem:
                return rejected(problem, key_id)
        try:
            message = self._decode(raw)
        except WireError as error:
            return rejected(f"undecodable value on {raw.topic}: {error}", key_id)
        problem = id_problem(message.saga_id, "saga_id")
        if problem:
            return rejected(problem, None)
        if key is None:
            return rejected("missing Kafka key: the key must be the saga id (UTF-8)", message.saga_id)
        if key != message.saga_id:
            return rejected(f"Kafka key {key!r} differs from saga_id {message.saga_id!r}", message.saga_id)
        field = nul_field({f.name: getattr(message, f.name) for f in dataclasses.fields(message)})
        if field:
            return rejected(f"{field} contains a NUL character", message.saga_id)
        start_input: dict[str, Any] | None = None
        if isinstance(message, StartSaga):
            message = dataclasses.replace(message, traceparent=valid_traceparent(raw.header(TRACEPARENT)))
            problem = _start_size_problem(len(raw.value))
            if problem is None:
                problem, start_input = self._read_start(message)
            if problem:
                saga_type = message.saga_type if id_problem(message.saga_type, "saga_type") is None else None
                return rejected(problem, message.saga_id, saga_type)
        if isinstance(message, SignalSaga):
            problem, start_input = self._check_signal(message, raw)
            if problem:
                return rejected(problem, message.saga_id)
        problem = _text_problem(message)
        if problem:
            return rejected(problem, message.saga_id)
        message = _clipped(message)
        if isinstance(message, StepResult):
            # Its inbox id derives from its key, so a key that is not its own saga's (a forged or misrouted
            # reply) must not take the id of the reply it imitates: refused before any claim.
            expected = (forward_key if message.kind is CommandKind.FORWARD else compensation_key)(
                message.saga_id, message.step)
            if message.idempotency_key != expected:
                return rejected(f"reply for {message.step!r} ({message.kind}) carries key "
                                f"{message.idempotency_key!r}, expected {expected!r}", message.saga_id)
            derived = reply_message_id(message.idempotency_key, message.attempt)
            return Envelope(message, message_id or derived, raw, (REPLY_IDS, derived))
        if message_id is not None:
            return Envelope(message, message_id, raw, (CLIENT_IDS, message_id), start_input)
        digest = content_digest(raw)
        return Envelope(message, f"content:{digest}", raw, (CONTENT_IDS, digest), start_input)

    def _decode(self, raw: ConsumedRecord
                ) -> StartSaga | CancelSaga | ResumeCompensation | ReleaseSaga | OperateSaga | SignalSaga | StepResult:
        assert raw.value is not None
        if raw.topic == self._start_topic:
            return wire.decode_start(raw.value, self._registry)
        if raw.topic == self._control_topic:
            name, _ = self._registry.decode(raw.value)
            if name == wire.RESUME_COMPENSATION:
                return wire.decode_resume(raw.value)
            if name == wire.RELEASE_SAGA:
                return wire.decode_release(raw.value)
            if name == wire.OPERATE_SAGA:
                return wire.decode_operate(raw.value)
            if name == wire.SIGNAL_SAGA:
                return wire.decode_signal(raw.value)
            return wire.decode_cancel(raw.value)
        if raw.topic in self._results_topics:
            return wire.decode_result(raw.value)
        raise WireError(f"topic {raw.topic} is not consumed by the orchestrator")

    def _check_signal(self, signal: SignalSaga, raw: ConsumedRecord) -> tuple[str | None, dict[str, Any] | None]:
        """Why a SignalSaga cannot be taken at the door (a bad signal id, a payload that is no record some saga
        type declares for the signal, or a signal-with-start whose start would be refused), or None; and the
        input record of the saga it starts, if it starts one."""
        problem = id_problem(signal.signal_id, "signal_id") or ("signal_id is empty" if not signal.signal_id.strip()
                                                                 else None)
        if problem:
            return problem, None
        try:
            name, record = self._registry.decode(signal.payload)
        except WireError as error:
            return f"payload of signal {signal.signal} is not a single-object-encoded record: {error}", None
        declared = {definition.signal_record(signal.signal) for definition in self._definitions.definitions()
                    if signal.start_saga_type in (None, definition.saga_type)} - {None}
        if declared and name not in declared:
            return f"signal {signal.signal} carries {' or '.join(sorted(str(d) for d in declared))}, not {name}", None
        field = nul_field(record)
        if field:
            return f"payload field {field} contains a NUL character", None
        start = signal.start()
        if start is None:
            return None, None
        return self._read_start(start)

    def _read_start(self, start: StartSaga) -> tuple[str | None, dict[str, Any] | None]:
        """Why ``start`` cannot be taken at the door (an unknown saga type, a version it names that is not
        registered or drains, every version of its type draining, an empty id, an input that is no
        record of its type's input schema or holds a NUL), or None; and its input record, decoded here once."""
        try:
            definition = start_definition(self._definitions, start)
        except StartRefused as refused:
            return str(refused), None
        if not start.saga_id.strip():
            return "saga_id is empty", None
        try:
            name, record = self._registry.decode(start.input)
        except WireError as error:
            return f"input of saga {start.saga_id} is not a single-object-encoded record: {error}", None
        if name != definition.input_schema:
            return f"input of saga type {start.saga_type!r} must be {definition.input_schema}, got {name}", None
        field = nul_field(record)
        if field:
            return f"input field {field} contains a NUL character", None
        return None, record


def _text_problem(message: wire.IncomingWire) -> str | None:
    """Why an operator's or client's text is too long to record (it goes into an event and the read model)."""
    texts = {"reason": getattr(message, "reason", None), "operator": getattr(message, "operator", None),
             "detail": getattr(message, "detail", None)}
    for name, text in texts.items():
        if text is not None and len(text) > MAX_TEXT_CHARS:
            return f"{name} of {len(text)} characters is longer than the {MAX_TEXT_CHARS} allowed"
    return None


def _clipped(message: T) -> T:
    """``message`` with the free text it carries into events cut to ``MAX_ERROR_MESSAGE_CHARS`` (marked "..."): a
    reply's error message, a signal's sender. The one place they are cut; the core records what it is given.
    (A client's or an operator's reason, operator and detail are refused above ``MAX_TEXT_CHARS`` instead.)"""
    if isinstance(message, StepResult) and len(message.error_message or "") > MAX_ERROR_MESSAGE_CHARS:
        return dataclasses.replace(message, error_message=clip_text(message.error_message))
    if isinstance(message, SignalSaga) and len(message.sender or "") > MAX_ERROR_MESSAGE_CHARS:
        return dataclasses.replace(message, sender=clip_text(message.sender))
    return message


def _start_size_problem(size: int) -> str | None:
    if size <= MAX_START_SAGA_BYTES:
        return None
    return (f"StartSaga of {size} bytes is larger than the {MAX_START_SAGA_BYTES} allowed: its SagaStarted event "
            "and commands, which carry its input, could not be stored or published")


def _key_text(key: bytes | None) -> str | None:
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None
