"""Hotel participant: ``book_hotel`` and its compensation ``cancel_hotel`` (table hotel.bookings)."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from ..kit.batch_rows import record_calls
from ..kit.effects import EffectTable
from ..kit.outcome import Failed, Proceed, Verdict
from ..kit.typed import Calling, StepContext, participant
from .records import Cancellation, HotelBooking, TripRequest

SCHEMA = "hotel"

# Business rules (pure); their triggers are the demo's scenarios.
SOLD_OUT_DESTINATION = "Atlantis"  # demo trigger: a definitive booking failure
SLOW_DESTINATION = "Slowtown"  # demo trigger: the booking reply comes late (a window to cancel in)
SLOW_REPLY_MS = 1_200  # below the book_hotel step timeout, so it is late but not timed out


def book_hotel_rule(destination: str) -> Verdict:
    """No rooms are left in some places."""
    if destination == SOLD_OUT_DESTINATION:
        return Failed("SoldOut", f"no rooms left in {destination}")
    if destination == SLOW_DESTINATION:
        return Proceed(reply_delay_ms=SLOW_REPLY_MS)
    return Proceed()


BUSINESS_DDL = (
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.bookings (
        booking_id bigserial PRIMARY KEY,
        saga_id text NOT NULL,
        step text NOT NULL,
        idempotency_key text NOT NULL UNIQUE,
        customer_id text NOT NULL,
        destination text NOT NULL,
        check_in text NOT NULL,
        check_out text NOT NULL,
        status text NOT NULL CHECK (status IN ('booked', 'cancelled')),
        booked_at timestamptz NOT NULL DEFAULT now(),
        cancelled_at timestamptz
    )""",
    f"CREATE INDEX IF NOT EXISTS bookings_saga_step_idx ON {SCHEMA}.bookings (saga_id, step)",
)

hotel = participant("hotel", tables=BUSINESS_DDL,
                    effects=EffectTable("bookings", counts={"booked": None, "cancelled": "status = 'cancelled'"}))

BOOKING_COLUMNS = {"saga_id": "text", "step": "text", "idempotency_key": "text", "customer_id": "text",
                   "destination": "text", "check_in": "text", "check_out": "text", "status": "text"}


@hotel.action(many=True, effect="booked")
async def book_hotel(tx: asyncpg.Connection, calls: Sequence[Calling[TripRequest]]) -> list[HotelBooking | Failed]:
    """Book a room at the destination for the trip's dates, for each saga step (one INSERT for all)."""
    verdicts = [book_hotel_rule(call.input.destination) for call in calls]
    return await record_calls(tx, calls, verdicts, f"{SCHEMA}.bookings", BOOKING_COLUMNS, _booking, HotelBooking)


def _booking(call: Calling[TripRequest]) -> tuple[str, ...]:
    trip = call.input
    return (call.step.saga_id, call.step.step, call.step.idempotency_key, trip.customer_id, trip.destination,
            trip.depart_date, trip.return_date, "booked")


@book_hotel.undo(effect="cancelled")
async def cancel_hotel(step: StepContext, trip: TripRequest) -> Cancellation:
    """Cancel the step's room; cancelling a booking that never happened succeeds as a no-op."""
    cancelled = await step.tx.fetch(
        f"""UPDATE {SCHEMA}.bookings SET status = 'cancelled', cancelled_at = now()
            WHERE saga_id = $1 AND step = $2 AND status = 'booked' RETURNING booking_id""",
        step.saga_id, step.step,
    )
    return Cancellation(cancelled_booking_ids=[row["booking_id"] for row in cancelled])
