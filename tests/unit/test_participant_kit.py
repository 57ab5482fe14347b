"""The participant kit's wire helpers (command decoding, StepResult replies, dead letters) and its
Participant definition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from saga_orchestrator.outbox.dead_letter_row import dead_letter_message
from saga_orchestrator.participants.kit.batch_rows import insert_rows
from saga_orchestrator.participants.kit.deliveries import decode_command
from saga_orchestrator.participants.kit.outcome import Failed, Outcome, ReceivedCommand, Succeeded
from saga_orchestrator.participants.kit.participant import Call, Participant
from saga_orchestrator.participants.kit.replies import outcome_message
from saga_orchestrator.schemas.headers import header_pairs, header_text
from saga_orchestrator.schemas.ids import reply_message_id
from saga_orchestrator.schemas.message_types import CommandKind
from saga_orchestrator.schemas.records import ConsumedRecord
from saga_orchestrator.schemas.registry import default_registry

TRIP = {
    "customer_id": "cust_1", "origin": "LHR", "destination": "JFK", "depart_date": "2030-01-01",
    "return_date": "2030-01-08", "currency": "EUR", "card_token": "tok_visa", "email": "a@example.com",
    "amount_cents": 12_300,
}


def _command_bytes(**overrides: object) -> bytes:
    registry = default_registry()
    record: dict[str, object] = {
        "saga_id": "s1", "saga_type": "trip", "step": "flight", "action": "book_flight",
        "kind": "FORWARD", "idempotency_key": "s1:flight", "attempt": 1,
        "input": registry.encode("saga.v1.trip.TripRequest", TRIP),
    }
    record.update(overrides)
    return registry.encode("saga.v1.StepCommand", record)


def _record(value: bytes) -> ConsumedRecord:
    return ConsumedRecord(topic="flight.commands", value=value)


def _command(attempt: int = 1) -> ReceivedCommand:
    return ReceivedCommand(
        saga_id="s1", saga_type="trip", step="flight", action="book_flight", kind=CommandKind.FORWARD,
        idempotency_key="s1:flight", attempt=attempt, input_type="saga.v1.trip.TripRequest",
        message_id="s1:command:3",
    )


def test_decode_command_reads_the_embedded_input() -> None:
    command, trip = decode_command("flight", _record(_command_bytes(attempt=2)), "m-1")
    assert command == replace(_command(attempt=2), message_id="m-1")
    assert trip == TRIP


def test_decode_command_rejects_garbage_and_a_garbage_input() -> None:
    with pytest.raises(ValueError):
        decode_command("flight", _record(b"not avro"), "m")
    with pytest.raises(ValueError):
        decode_command("flight", _record(_command_bytes(input=b"\xc3\x01junkjunk")), "m")


def test_headers_accept_mappings_and_pairs() -> None:
    assert header_pairs({"a": "x", "b": b"y", "c": None}) == (("a", b"x"), ("b", b"y"), ("c", None))
    pairs = header_pairs([("message_id", b"1"), ("message_id", b"2"), ("bad", b"\xff")])
    assert header_text(pairs, "message_id") == "2"
    assert header_text(pairs, "bad") is None
    assert header_text(pairs, "missing") is None
    assert header_pairs(None) == ()


def test_success_reply_carries_the_command_identity_and_headers() -> None:
    registry = default_registry()
    message = outcome_message(_command(2), "flight.results", Succeeded(b"{}"), now_ms=1000)
    assert message.message_id == reply_message_id("s1:flight", 2) == "s1:flight:reply:2"
    assert message.key == "s1"
    assert message.available_at is None
    assert message.headers == {
        "message_id": "s1:flight:reply:2", "causation_id": "s1:command:3",
        "saga_id": "s1", "saga_type": "trip",
    }
    name, result = registry.decode(message.value)
    assert name == "saga.v1.StepResult"
    assert result == {
        "saga_id": "s1", "step": "flight", "kind": "FORWARD", "idempotency_key": "s1:flight", "attempt": 2,
        "status": "SUCCEEDED", "retryable": False, "error_type": None, "error_message": None, "output": b"{}",
        "operator": None, "detail": None,  # a handler's own reply: no person answered
    }


def test_delayed_transient_failure_reply() -> None:
    registry = default_registry()
    outcome = Failed("CardNetworkTimeout", "slow", retryable=True, reply_delay_ms=4000)
    message = outcome_message(_command(), "payment.results", outcome, now_ms=1000)
    assert message.available_at == 5000
    _, result = registry.decode(message.value)
    assert (result["status"], result["retryable"]) == ("FAILED", True)
    assert result["error_type"] == "CardNetworkTimeout"


def test_dead_letter_keeps_the_original_message() -> None:
    registry = default_registry()
    record = ConsumedRecord(topic="flight.commands", partition=3, offset=42, key=b"s9", value=b"junk",
                            headers=(("saga_id", b"s9"), ("message_id", b"s9:command:1")))
    message = dead_letter_message("saga.dlq", record, reason="bad", consumer="participant-flight", now_ms=7,
                                  saga_id=record.header("saga_id"))
    assert message.message_id == "dlq:flight.commands:3:42"
    assert message.key == "s9"
    assert message.headers == {"message_id": "dlq:flight.commands:3:42", "causation_id": "s9:command:1",
                               "saga_id": "s9"}
    name, letter = registry.decode(message.value)
    assert name == "saga.v1.DeadLetter"
    assert letter["original_value"] == b"junk"
    assert letter["original_key"] == b"s9"
    assert letter["original_headers"] == [{"key": "saga_id", "value": b"s9"},
                                          {"key": "message_id", "value": b"s9:command:1"}]
    assert (letter["source_partition"], letter["source_offset"], letter["failed_at"]) == (3, 42, 7)


def test_dead_letter_without_an_offset_gets_a_content_based_id() -> None:
    first, second = (dead_letter_message("saga.dlq", ConsumedRecord(topic="flight.commands", value=b"junk"),
                                         reason="bad", consumer="c", now_ms=1) for _ in range(2))
    assert first.message_id == second.message_id
    assert first.message_id.startswith("dlq:flight.commands:")
    assert first.key == ""


async def _two_outcomes(conn: Any, calls: Sequence[Call]) -> Sequence[Outcome]:
    return [Succeeded(f"{command.saga_id}:{trip['origin']}".encode()) for command, trip in calls] * 2


async def _no_change(conn: Any, command: ReceivedCommand, trip: Mapping[str, Any]) -> Outcome:
    return Succeeded(b"single")


async def _echo(conn: Any, calls: Sequence[Call]) -> Sequence[Outcome]:
    return [Succeeded(f"{command.saga_id}:{trip['origin']}".encode()) for command, trip in calls]


async def test_an_action_with_only_a_batch_handler_runs_a_single_command_as_a_batch_of_one() -> None:
    participant = Participant(name="p", schema="p", batch_handlers={"book_flight": _echo})
    handler = participant.handler("book_flight")
    assert handler is not None
    assert await handler(None, _command(), TRIP) == Succeeded(b"s1:LHR")
    assert participant.handler("cancel_flight") is None


async def test_a_single_handler_is_preferred_for_one_command() -> None:
    participant = Participant(name="p", schema="p", handlers={"book_flight": _no_change},
                              batch_handlers={"book_flight": _echo})
    handler = participant.handler("book_flight")
    assert handler is not None
    assert await handler(None, _command(), TRIP) == Succeeded(b"single")


async def test_a_batch_of_one_answered_with_two_outcomes_is_an_error() -> None:
    handler = Participant(name="p", schema="p", batch_handlers={"book_flight": _two_outcomes}).handler("book_flight")
    assert handler is not None
    with pytest.raises(RuntimeError, match="2 outcomes for 1 command"):
        await handler(None, _command(), TRIP)


def test_a_participant_needs_a_handler() -> None:
    with pytest.raises(ValueError, match="'p' has no handlers"):
        Participant(name="p", schema="p")


def test_reads_checks_the_input_type() -> None:
    participant = Participant(name="p", schema="p", handlers={"book_flight": _no_change},
                              input_types=frozenset({"saga.v1.trip.TripRequest"}))
    assert participant.reads(_command())
    assert not participant.reads(replace(_command(), input_type="shop.v1.Order"))


async def test_insert_rows_needs_the_idempotency_key_to_match_rows() -> None:
    with pytest.raises(ValueError, match="idempotency_key"):
        await insert_rows(None, "t.rows", {"saga_id": "text"}, [("s1",)], "row_id")
