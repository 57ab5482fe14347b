"""The trip's records come from its pydantic models, and its input is still the record 0.1 released."""

from __future__ import annotations

import json

from fastavro.schema import parse_schema, to_parsing_canonical_form

from saga_orchestrator.infra.app import LoadedApp, stale_records
from saga_orchestrator.participants.trip import TRIP_REQUEST, app
from saga_orchestrator.schemas.registry import SCHEMAS_DIR


def test_the_trips_app_has_nothing_to_refuse() -> None:
    assert app.problems() == []


def test_the_trips_record_files_are_what_its_models_generate() -> None:
    assert stale_records(LoadedApp(app, "saga_orchestrator.participants.trip:app", "SAGA_APP")) == []
    assert sorted(record.full_name for record in app.records()) == [
        "saga.v1.flight.Cancellation", "saga.v1.flight.FlightBooking", "saga.v1.hotel.Cancellation",
        "saga.v1.hotel.HotelBooking", "saga.v1.notification.Itinerary", "saga.v1.payment.Charge",
        "saga.v1.payment.Refund", TRIP_REQUEST]


def test_the_typed_trip_request_is_the_released_record() -> None:
    [current] = [record.schema() for record in app.records() if record.full_name == TRIP_REQUEST]
    released = json.loads((SCHEMAS_DIR / "released" / "0.1.0" / "inputs" / "trip_request.avsc").read_text())
    assert to_parsing_canonical_form(parse_schema(current)) == to_parsing_canonical_form(parse_schema(released))
