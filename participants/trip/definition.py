"""The trip saga's definition: book a flight and a hotel in parallel, charge the card (the pivot), send the
itinerary.

Backoffs and timeouts are short so that a demo run, including its retries, takes seconds.
"""

from __future__ import annotations

from ...orchestrator.domain.definition import (
    UNLIMITED_RETRY,
    DefinitionRegistry,
    RetryPolicy,
    SagaDefinition,
    Step,
)

TRIP_REQUEST = "saga.v1.trip.TripRequest"
"""Its input record (``inputs/trip_request.avsc`` beside this module)."""

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

TRIP = SagaDefinition(
    saga_type="trip",
    version=1,
    input_schema=TRIP_REQUEST,
    steps=(
        Step(
            name="book_flight",
            participant="flight",
            command="book_flight",
            compensation="cancel_flight",
            retry=BOOKING_RETRY,
            compensation_retry=CANCEL_FLIGHT_RETRY,
            timeout_ms=2_000,
            compensation_timeout_ms=2_000,
        ),
        Step(
            name="book_hotel",
            participant="hotel",
            command="book_hotel",
            compensation="cancel_hotel",
            retry=BOOKING_RETRY,
            compensation_retry=COMPENSATION_RETRY,
            timeout_ms=2_000,
            compensation_timeout_ms=2_000,
        ),
        Step(
            name="charge_card",
            participant="payment",
            command="charge_card",
            # Only used when a cancel raced an in-flight charge that then went through.
            compensation="refund_card",
            depends_on=("book_flight", "book_hotel"),
            pivot=True,
            retry=RetryPolicy(
                max_attempts=5,
                initial_backoff_ms=200,
                multiplier=2.0,
                max_backoff_ms=2_000,
                non_retryable_errors=frozenset({"CardDeclined"}),
            ),
            compensation_retry=COMPENSATION_RETRY,
            timeout_ms=2_000,
            compensation_timeout_ms=3_000,
        ),
        Step(
            name="send_itinerary",
            participant="notification",
            command="send_itinerary",
            depends_on=("charge_card",),
            # After the pivot the saga only moves forward: retry until it goes through.
            retry=RetryPolicy(max_attempts=None, initial_backoff_ms=200, max_backoff_ms=2_000),
            timeout_ms=3_000,
        ),
    ),
)


def default_registry() -> DefinitionRegistry:
    """A registry holding every saga definition shipped with the orchestrator."""
    return DefinitionRegistry([TRIP])


__all__ = ["TRIP", "UNLIMITED_RETRY", "default_registry"]
