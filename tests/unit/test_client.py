"""The Python client's checks and encoding, without Kafka: a bad start is refused before anything is sent."""

from __future__ import annotations

from typing import Any

import pytest

from saga_orchestrator.client import SagaClient, SagaInputError
from saga_orchestrator.client.saga_client import _event_of, client_headers, input_records
from saga_orchestrator.participants.trip.definition import trip_definitions
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import SagaStarted
from tests.trip_runs import trip_run

TRIP: dict[str, Any] = {
    "customer_id": "c-7", "origin": "LIS", "destination": "NYC", "depart_date": "2027-03-01",
    "return_date": "2027-03-09", "currency": "EUR", "card_token": "tok_ok", "email": "ana@example.test",
    "amount_cents": 84_900,
}
CLIENT = SagaClient("127.0.0.1:1", input_records(trip_definitions().definitions()))  # never connected


def test_a_valid_start_encodes_the_input_record_of_its_type() -> None:
    start = wire.decode_start(CLIENT.encode_start("trip", "trip-42", TRIP, tenant_id="acme"))
    assert (start.saga_id, start.saga_type, start.tenant_id) == ("trip-42", "trip", "acme")
    assert wire.decode_input(start.input, "saga.v1.trip.TripRequest") == ("saga.v1.trip.TripRequest", TRIP)
    assert start.definition_version is None  # the latest version that takes starts


def test_a_start_may_name_the_definition_version_to_start_on() -> None:
    assert wire.decode_start(CLIENT.encode_start("trip", "trip-42", TRIP, version=2)).definition_version == 2
    with pytest.raises(SagaInputError, match=r"version must be a definition version \(>= 1\), got 0"):
        CLIENT.encode_start("trip", "trip-42", TRIP, version=0)


@pytest.mark.parametrize(("saga_type", "saga_id", "saga_input", "field", "problem"), [
    ("cruise", "x", TRIP, "saga_type", "unknown saga type 'cruise'; known types: trip"),
    ("trip", "  ", TRIP, "saga_id", "must not be empty"),
    ("trip", "x" * 513, TRIP, "saga_id", "of 513 bytes is longer than the 512 allowed"),
    ("trip", "a\x00b", TRIP, "saga_id", "contains a NUL character"),
    ("trip", "x", {**TRIP, "amount_cents": "12"}, "saga_input", "amount_cents"),
    ("trip", "x", {k: v for k, v in TRIP.items() if k != "email"}, "saga_input", "email"),
])
def test_a_start_that_cannot_be_valid_is_refused_and_says_which_argument(
        saga_type: str, saga_id: str, saga_input: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(SagaInputError) as refused:
        CLIENT.encode_start(saga_type, saga_id, saga_input)
    assert refused.value.field == field and problem in refused.value.problem


async def test_a_bad_trace_context_is_refused_before_connecting() -> None:
    with pytest.raises(SagaInputError, match="traceparent is not a W3C trace context"):
        await CLIENT.start("trip", "x", TRIP, traceparent="00-nope")


async def test_a_client_not_connected_says_so() -> None:
    with pytest.raises(RuntimeError, match="not connected"):
        await CLIENT.start("trip", "x", TRIP)


def test_published_records_carry_a_fresh_message_id_and_the_saga_headers() -> None:
    first, second = (dict(client_headers("trip-42", "trip", "00-" + "a" * 32 + "-" + "b" * 16 + "-01"))
                     for _ in range(2))
    assert first["message_id"] != second["message_id"]
    assert (first["saga_id"], first["saga_type"]) == (b"trip-42", b"trip")
    assert first["traceparent"].startswith(b"00-aaaa")
    assert "saga_type" not in dict(client_headers("trip-42"))


def test_a_handle_takes_only_its_sagas_decodable_events() -> None:
    run = trip_run("completed", "trip-42")
    started = wire.encode_event(run.events[0])
    other = wire.encode_event(trip_run("completed", "trip-43").events[0])
    assert isinstance(_event_of(b"trip-42", started, b"trip-42", "trip-42"), SagaStarted)
    assert _event_of(b"trip-43", other, b"trip-42", "trip-42") is None  # another key on the partition
    assert _event_of(b"trip-42", other, b"trip-42", "trip-42") is None  # a record whose body is another saga's
    assert _event_of(b"trip-42", b"\xc3\x01garbage", b"trip-42", "trip-42") is None
    assert _event_of(b"trip-42", None, b"trip-42", "trip-42") is None
