"""Bad input found by the poison fuzzer (tests/chaos/test_poison.py), each pinned down at the place it is
refused: ids no store can key on, NUL characters, dead letters too large for the DLQ topic, a command whose
Kafka key is not its saga id, and rejections handled a batch at a time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from examples.loans.loan import app as loans
from examples.loans.loan import loan
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry
from saga_orchestrator.orchestrator.domain.messages import RejectedRecord
from saga_orchestrator.orchestrator.inbound import REJECTED_IDS, Envelope, RecordParser
from saga_orchestrator.orchestrator.service import Outcome, SagaService
from saga_orchestrator.orchestrator.store.memory import MemoryStore
from saga_orchestrator.outbox.dead_letter_row import dead_letter_message
from saga_orchestrator.participants.kit.deliveries import decode_command, key_problem
from saga_orchestrator.participants.trip import PARTICIPANTS
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.codec import WireError
from saga_orchestrator.schemas.event_types import SagaRejected
from saga_orchestrator.schemas.limits import (
    DEAD_LETTER_MAX_BYTES,
    MAX_MESSAGE_ID_BYTES,
    MAX_REJECTION_REASON_CHARS,
    MAX_SAGA_ID_BYTES,
    MAX_START_SAGA_BYTES,
    id_problem,
    nul_field,
)
from saga_orchestrator.schemas.message_types import CancelSaga, DeadLetter, SignalSaga, StartSaga
from saga_orchestrator.schemas.records import ConsumedRecord
from saga_orchestrator.schemas.registry import SchemaRegistry, default_registry, load_tree
from saga_orchestrator.schemas.topics import Topics

TOPICS = Topics("")
TRIP_INPUT = {
    "customer_id": "c-1", "origin": "LIS", "destination": "NYC", "depart_date": "2027-03-01",
    "return_date": "2027-03-09", "currency": "EUR", "card_token": "tok_ok", "email": "a@example.test",
    "amount_cents": 100,
}


def _parser() -> RecordParser:
    return RecordParser(TOPICS, DefinitionRegistry([TRIP]), default_registry(), PARTICIPANTS)


def _start(saga_id: str, **changes: object) -> bytes:
    trip = wire.encode_input("saga.v1.trip.TripRequest", {**TRIP_INPUT, **changes.pop("trip", {})})  # type: ignore[dict-item]
    fields: dict[str, object] = {"saga_id": saga_id, "saga_type": "trip", "tenant_id": None, "input": trip}
    return wire.encode_start(StartSaga(**{**fields, **changes}))  # type: ignore[arg-type]


def _rejected(envelope: Envelope) -> RejectedRecord:
    """The RejectedRecord a parsed record became (it fails the test when it became a message)."""
    assert isinstance(envelope.message, RejectedRecord), envelope.message
    return envelope.message


def _accepted(envelope: Envelope) -> bool:
    return not isinstance(envelope.message, RejectedRecord)


def _raw(topic: str, key: bytes | None, value: bytes | None,
         headers: tuple[tuple[str, bytes | None], ...] = ()) -> ConsumedRecord:
    return ConsumedRecord(topic=topic, partition=1, offset=7, key=key, value=value, headers=headers)


def test_limits_name_the_problem() -> None:
    assert id_problem("s-1", "saga_id") is None
    assert id_problem("x" * (MAX_SAGA_ID_BYTES + 1), "saga_id") == (
        f"saga_id of {MAX_SAGA_ID_BYTES + 1} bytes is longer than the {MAX_SAGA_ID_BYTES} allowed")
    assert id_problem("é" * 300, "saga_id") is not None  # bytes, not characters
    assert id_problem("a\x00b", "message_id") == "message_id contains a NUL character"
    assert nul_field({"a": "ok", "b": [{"c": "x\x00"}]}) == "b.0.c"
    assert nul_field({"a": b"\x00bytes are fine"}) is None


def test_an_oversized_saga_id_is_refused_without_recording_under_it() -> None:
    saga_id = "s" * 8000
    parsed = _rejected(_parser().parse(_raw("saga.start", saga_id.encode(), _start(saga_id))))
    assert parsed.reason == f"saga_id of 8000 bytes is longer than the {MAX_SAGA_ID_BYTES} allowed"
    assert parsed.saga_id is None  # a SagaRejected under that id could never be stored


def test_an_oversized_message_id_is_refused_before_it_reaches_the_inbox() -> None:
    headers = (("message_id", b"m" * (MAX_MESSAGE_ID_BYTES + 1)),)
    parsed = _rejected(_parser().parse(_raw("saga.control", b"s-1",
                                            wire.encode_cancel(CancelSaga(saga_id="s-1", reason="r")), headers)))
    assert "message_id header" in parsed.reason
    assert parsed.saga_id == "s-1"


@pytest.mark.parametrize(("value", "field"), [
    (_start("s\x00id"), "saga_id"),
    (_start("s-1", tenant_id="t\x00"), "tenant_id"),
    (_start("s-1", trip={"email": "a\x00@example.test"}), "input field email"),
])
def test_a_nul_character_is_refused(value: bytes, field: str) -> None:
    key = wire.decode_start(value).saga_id.encode()
    parsed = _rejected(_parser().parse(_raw("saga.start", key, value)))
    assert field in parsed.reason and "NUL" in parsed.reason


def test_a_valid_start_still_parses() -> None:
    parsed = _parser().parse(_raw("saga.start", b"s-1", _start("s-1"), (("message_id", b"m-1"),)))
    assert _accepted(parsed) and parsed.message_id == "m-1"


def test_an_unusable_saga_type_is_not_recorded_and_a_long_reason_is_clipped() -> None:
    saga_type = "cruise" * 200
    parsed = _rejected(_parser().parse(_raw("saga.start", b"s-1", _start("s-1", saga_type=saga_type))))
    assert parsed.saga_id == "s-1"
    assert parsed.saga_type is None
    assert len(parsed.reason) <= MAX_REJECTION_REASON_CHARS + 3


def test_a_start_too_large_for_its_events_is_refused() -> None:
    tenant = "t" * (MAX_START_SAGA_BYTES - len(_start("s-1")) + 10)
    value = _start("s-1", tenant_id=tenant)
    parsed = _rejected(_parser().parse(_raw("saga.start", b"s-1", value)))
    assert parsed.saga_id == "s-1"
    assert parsed.reason.startswith(f"StartSaga of {len(value)} bytes is larger than the {MAX_START_SAGA_BYTES}")
    fits = _start("s-1", tenant_id=tenant[:-20])
    assert _accepted(_parser().parse(_raw("saga.start", b"s-1", fits)))


def test_a_dead_letter_always_fits_the_dlq_topic() -> None:
    huge_key = b"k" * 600_000  # with the header: more than a letter can hold even without the value
    letter = DeadLetter(
        source_topic="saga.start", source_partition=0, source_offset=1, consumer="orchestrator",
        reason="r" * 10_000, failed_at=0, saga_id="s" * 5000, original_key=huge_key,
        original_value=b"v" * 900_000, original_headers=(("big", b"h" * 500_000),),
    )
    data = wire.encode_dead_letter(letter)
    decoded = wire.decode_dead_letter(data)
    assert len(data) <= DEAD_LETTER_MAX_BYTES
    assert decoded.original_value is None and decoded.original_key is None and decoded.original_headers == ()
    assert "original value of 900000 bytes not kept" in decoded.reason
    assert "original key and headers not kept" in decoded.reason
    assert decoded.saga_id is None  # not a usable id
    small = replace(letter, reason="r", saga_id="s-1", original_key=b"s-1", original_value=b"v" * 100,
                    original_headers=(("message_id", None),))
    assert wire.decode_dead_letter(wire.encode_dead_letter(small)) == small


def test_a_dead_letter_row_carries_only_usable_ids_in_its_key_and_headers() -> None:
    raw = _raw("saga.start", b"k" * 10_000, b"v" * 1_040_000, (("message_id", b"m\x00" * 600),))
    row = dead_letter_message(TOPICS.dlq, raw, reason="reason", consumer="orchestrator", now_ms=0)
    assert row.key == "" and row.headers["causation_id"] == "saga.start:1:7"  # its position: no usable id
    assert "saga_id" not in row.headers
    assert len(row.value) <= DEAD_LETTER_MAX_BYTES
    assert wire.decode_dead_letter(row.value).source_offset == 7


def test_a_participant_dead_letter_fits_and_takes_a_tombstone() -> None:
    tombstone = ConsumedRecord(topic="flight.commands", partition=0, offset=3, key=b"s-1", value=None,
                               headers=(("saga_id", b"s" * 5000), ("message_id", b"x\x00")))
    row = dead_letter_message("saga.dlq", tombstone, reason="empty value", consumer="flight", now_ms=0,
                              saga_id=tombstone.header("saga_id"))
    assert row.key == "s-1" and "saga_id" not in row.headers and row.headers["causation_id"] == "flight.commands:0:3"
    assert wire.decode_dead_letter(row.value).original_value is None
    big = dead_letter_message("saga.dlq", ConsumedRecord(topic="flight.commands", partition=0, offset=4, key=b"s-1",
                                                         value=b"v" * 1_100_000), reason="too big", consumer="flight",
                              now_ms=0)
    assert len(big.value) <= DEAD_LETTER_MAX_BYTES


def _command(**changes: object) -> bytes:
    registry = default_registry()
    record: dict[str, object] = {
        "saga_id": "s-1", "saga_type": "trip", "step": "book_flight", "action": "book_flight",
        "kind": "FORWARD", "idempotency_key": "s-1:book_flight", "attempt": 1,
        "input": registry.encode("saga.v1.trip.TripRequest", TRIP_INPUT),
    }
    return registry.encode("saga.v1.StepCommand", {**record, **changes})


@pytest.mark.parametrize("changes", [
    {"saga_id": "s" * 600, "idempotency_key": "s" * 600 + ":book_flight"},
    {"idempotency_key": "k" * (MAX_MESSAGE_ID_BYTES + 1)},
    {"saga_id": "", "idempotency_key": ":book_flight"},
    {"step": "book\x00flight"},
    {"input": default_registry().encode("saga.v1.trip.TripRequest", {**TRIP_INPUT, "origin": "L\x00S"})},
])
def test_a_command_no_store_can_hold_is_undecodable(changes: dict[str, object]) -> None:
    with pytest.raises(WireError):
        decode_command("flight", ConsumedRecord(topic="flight.commands", value=_command(**changes)), "m-1")
    with pytest.raises(WireError, match="tombstone"):
        decode_command("flight", ConsumedRecord(topic="flight.commands"), "m-1")


def test_a_command_key_must_be_its_saga_id() -> None:
    def delivery(key: bytes | None, offset: int = 5) -> ConsumedRecord:
        return ConsumedRecord(topic="flight.commands", partition=0, offset=offset, key=key)

    assert key_problem(delivery(b"s-1"), "s-1") is None
    assert key_problem(delivery(None, offset=-1), "s-1") is None  # a direct call: no Kafka record
    assert key_problem(delivery(None), "s-1") == "missing Kafka key: the key must be the saga id (UTF-8)"
    assert "differs from saga_id" in (key_problem(delivery(b"other"), "s-1") or "")
    assert key_problem(delivery(b"\xffs-1"), "s-1") is not None


async def test_rejections_are_handled_a_batch_at_a_time_in_order_and_deduplicated() -> None:
    store = MemoryStore()
    service = SagaService(store, DefinitionRegistry([TRIP]), TOPICS, lambda: 1_000)
    rejections = [
        Envelope(RejectedRecord(saga_id=saga_id, saga_type=None, reason=f"bad {offset}"), f"saga.start:0:{offset}",
                 ConsumedRecord(topic="saga.start", partition=0, offset=offset, key=b"s-1", value=b"junk"),
                 (REJECTED_IDS, f"saga.start:0:{offset}"))
        for offset, saga_id in ((1, "s-1"), (2, "s-1"), (3, None), (4, "s-2"))
    ]
    duplicate = replace(rejections[0])
    outcomes = await service.handle_many([*rejections, duplicate])
    assert outcomes == [Outcome.DEAD_LETTERED] * 4 + [Outcome.DUPLICATE]
    assert [(e.saga_id, e.seq) for e in store.events["s-1"]] == [("s-1", 1), ("s-1", 2)]
    assert [e.event_type for e in store.events["s-2"]] == [SagaRejected.__name__]
    letters = [wire.decode_dead_letter(m.value) for m in store.drain_outbox() if m.topic == TOPICS.dlq]
    assert [letter.source_offset for letter in letters] == [1, 2, 3, 4]
    assert await service.handle_many(rejections) == [Outcome.DUPLICATE] * 4  # redelivered: nothing again


async def test_a_saga_with_good_and_rejected_records_in_one_batch_sees_them_in_order() -> None:
    store = MemoryStore()
    service = SagaService(store, DefinitionRegistry([TRIP]), TOPICS, lambda: 1_000)
    parser = _parser()
    records = [_raw("saga.start", b"s-9", _start("s-9"), (("message_id", b"m-1"),)),
               ConsumedRecord(topic="saga.control", partition=0, offset=8, key=b"s-9", value=b"junk"),
               _raw("saga.control", b"s-9", wire.encode_cancel(CancelSaga(saga_id="s-9", reason="r")),
                    (("message_id", b"m-3"),))]
    outcomes = await service.handle_many([parser.parse(record) for record in records])
    assert outcomes == [Outcome.APPLIED, Outcome.DEAD_LETTERED, Outcome.APPLIED]
    names = [e.event_type for e in store.events["s-9"]]
    assert names[0] == "SagaStarted"
    rejected_at, cancel_at = names.index("SagaRejected"), names.index("SagaCancelRequested")
    assert names.count("SagaRejected") == 1 and 0 < rejected_at < cancel_at


def _signal_parser() -> tuple[RecordParser, SchemaRegistry]:
    assert loans.schema_folder is not None
    schemas = SchemaRegistry([*default_registry().current_schemas(), *load_tree(loans.schema_folder).values()])
    return RecordParser(TOPICS, DefinitionRegistry([TRIP, loan.definition]), schemas, PARTICIPANTS), schemas


def _signal(schemas: SchemaRegistry, **changes: object) -> bytes:
    approval = schemas.encode("saga.v1.loan.Approval", {"approver": "ada", "limit_cents": 5})
    fields: dict[str, object] = {"saga_id": "l-1", "signal_id": "sig-1", "signal": "Approval", "payload": approval}
    return wire.encode_signal(SignalSaga(**{**fields, **changes}))  # type: ignore[arg-type]


def test_a_signal_is_refused_at_the_door_unless_its_payload_is_the_record_declared_for_it() -> None:
    parser, schemas = _signal_parser()
    assert _accepted(parser.parse(_raw("saga.control", b"l-1", _signal(schemas))))
    hold = schemas.encode("saga.v1.treasury.Hold", {"hold_id": "h"})
    for changes, reason in (
            ({"payload": b"not avro"}, "payload of signal Approval is not a single-object-encoded record"),
            ({"payload": hold}, "signal Approval carries saga.v1.loan.Approval, not saga.v1.treasury.Hold"),
            ({"signal_id": ""}, "signal_id is empty"),
            ({"start_saga_type": "cruise", "start_input": b"x"}, "unknown saga_type 'cruise'")):
        parsed = _rejected(parser.parse(_raw("saga.control", b"l-1", _signal(schemas, **changes))))
        assert parsed.saga_id == "l-1" and reason in parsed.reason, parsed.reason
