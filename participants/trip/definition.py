"""The trip saga's definition: book a flight and a hotel in parallel, charge the card (the pivot), send the
itinerary; and the trip's app, which names its saga type, participants and schema folder.

Backoffs and timeouts are short so that a demo run, including its retries, takes seconds.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from ...authoring import Saga, SagaApp
from ...orchestrator.domain.definition import UNLIMITED_RETRY, DefinitionRegistry, RetryPolicy
from .flight import book_flight, flight
from .hotel import book_hotel, hotel
from .notification import notification, send_itinerary
from .payment import charge_card, payment
from .records import TripRequest

BOOKING_RETRY = RetryPolicy(max_attempts=3, initial_backoff_ms=100, multiplier=2.0, max_backoff_ms=2_000)
# Undoing retries forever by default (orchestrator/observe.py logs a WARNING at attempts 5, 10, 20...); a
# refusal to cancel cannot get better by retrying, so it stops the unwinding and waits for a human.
CANCEL_FLIGHT_RETRY = RetryPolicy(
    max_attempts=None,
    initial_backoff_ms=100,
    multiplier=2.0,
    max_backoff_ms=2_000,
    non_retryable_errors=frozenset({"CancellationRefused"}),
)
COMPENSATION_RETRY = RetryPolicy(max_attempts=None, initial_backoff_ms=100, max_backoff_ms=2_000)
CHARGE_RETRY = RetryPolicy(max_attempts=5, initial_backoff_ms=200, multiplier=2.0, max_backoff_ms=2_000,
                           non_retryable_errors=frozenset({"CardDeclined"}))
TWO_SECONDS = timedelta(seconds=2)

trip = Saga("trip", input=TripRequest, searchable=("customer_id", "email"))
flight_booked = trip.step(book_flight, retry=BOOKING_RETRY, undo_retry=CANCEL_FLIGHT_RETRY, timeout=TWO_SECONDS,
                          undo_timeout=TWO_SECONDS)
hotel_booked = trip.step(book_hotel, retry=BOOKING_RETRY, undo_retry=COMPENSATION_RETRY, timeout=TWO_SECONDS,
                         undo_timeout=TWO_SECONDS)
# The pivot's refund is only used when a cancel raced an in-flight charge that then went through.
charged = trip.step(charge_card, after=[flight_booked, hotel_booked], pivot=True, retry=CHARGE_RETRY,
                    undo_retry=COMPENSATION_RETRY, timeout=TWO_SECONDS, undo_timeout=timedelta(seconds=3))
# After the pivot the saga only moves forward: retry until it goes through.
trip.step(send_itinerary, after=[charged],
          retry=RetryPolicy(max_attempts=None, initial_backoff_ms=200, max_backoff_ms=2_000),
          timeout=timedelta(seconds=3))

app = SagaApp(sagas=[trip], participants=[flight, hotel, payment, notification], schema_folder=Path(__file__).parent)
"""The trip's deployment: ``SAGA_APP=saga_orchestrator.participants.trip:app`` (what ``make demo`` names). It
also runs as a 0.1 deployment does, on ``SAGA_DEFINITIONS=saga_orchestrator.participants.trip:TRIP`` and
``SAGA_PARTICIPANTS=flight,hotel,payment,notification``; no setting names it by default."""

TRIP = trip.definition
"""The engine's form of the trip saga (what SAGA_DEFINITIONS names)."""

TRIP_REQUEST = trip.input_record.full_name
"""Its input record, ``saga.v1.trip.TripRequest`` (``inputs/TripRequest.avsc`` beside this module)."""


def trip_definitions() -> DefinitionRegistry:
    """A definition registry holding the trip (not ``schemas.registry.default_registry``, the schema registry)."""
    return DefinitionRegistry([TRIP])


__all__ = ["TRIP", "TRIP_REQUEST", "UNLIMITED_RETRY", "app", "trip", "trip_definitions"]
