"""Flight participant: ``book_flight`` and its compensation ``cancel_flight`` (table flight.bookings)."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from ..kit.batch_rows import record_calls
from ..kit.effects import EffectTable
from ..kit.outcome import Failed, Proceed, Verdict
from ..kit.typed import Calling, StepContext, participant
from .records import Cancellation, FlightBooking, TripRequest

SCHEMA = "flight"

# Business rules (pure); their triggers are the demo's scenarios.
UNCANCELLABLE_CUSTOMER = "cust_uncancellable"  # demo trigger: a compensation that fails for good


def book_flight_rule(origin: str, destination: str) -> Verdict:
    """A flight needs two different airports."""
    if origin == destination:
        return Failed("InvalidRoute", f"origin and destination are both {origin!r}")
    return Proceed()


def cancel_flight_rule(customer_id: str) -> Verdict:
    """Some fares cannot be cancelled."""
    if customer_id == UNCANCELLABLE_CUSTOMER:
        return Failed("CancellationRefused", f"the fare of {customer_id} cannot be cancelled")
    return Proceed()

# (saga_id, step) is deliberately not unique: a second booking for one step would be a double effect
# that saga verify must be able to see.
BUSINESS_DDL = (
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.bookings (
        booking_id bigserial PRIMARY KEY,
        saga_id text NOT NULL,
        step text NOT NULL,
        idempotency_key text NOT NULL UNIQUE,
        customer_id text NOT NULL,
        origin text NOT NULL,
        destination text NOT NULL,
        depart_date text NOT NULL,
        return_date text NOT NULL,
        status text NOT NULL CHECK (status IN ('booked', 'cancelled')),
        booked_at timestamptz NOT NULL DEFAULT now(),
        cancelled_at timestamptz
    )""",
    f"CREATE INDEX IF NOT EXISTS bookings_saga_step_idx ON {SCHEMA}.bookings (saga_id, step)",
    # An operator's way out of CancellationRefused: the airline agreed to cancel this saga's fare anyway.
    # Grant one, then `saga resume SAGA_ID`: the cancellation is tried again and goes through.
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.cancellation_waivers (
        saga_id text PRIMARY KEY,
        granted_by text,
        granted_at timestamptz NOT NULL DEFAULT now()
    )""",
)

flight = participant("flight", tables=BUSINESS_DDL,
                     effects=EffectTable("bookings", counts={"booked": None, "cancelled": "status = 'cancelled'"}))

BOOKING_COLUMNS = {"saga_id": "text", "step": "text", "idempotency_key": "text", "customer_id": "text",
                   "origin": "text", "destination": "text", "depart_date": "text", "return_date": "text",
                   "status": "text"}


@flight.action(many=True, effect="booked")
async def book_flight(tx: asyncpg.Connection, calls: Sequence[Calling[TripRequest]]) -> list[FlightBooking | Failed]:
    """Book the trip's flight for each saga step (one INSERT for all of them)."""
    verdicts = [book_flight_rule(call.input.origin, call.input.destination) for call in calls]
    return await record_calls(tx, calls, verdicts, f"{SCHEMA}.bookings", BOOKING_COLUMNS, _booking, FlightBooking)


def _booking(call: Calling[TripRequest]) -> tuple[str, ...]:
    trip = call.input
    return (call.step.saga_id, call.step.step, call.step.idempotency_key, trip.customer_id, trip.origin,
            trip.destination, trip.depart_date, trip.return_date, "booked")


@book_flight.undo(effect="cancelled")
async def cancel_flight(step: StepContext, trip: TripRequest) -> Cancellation | Failed:
    """Cancel the step's booking; a booking that never happened is already 'cancelled' (no-op). A fare that
    cannot be cancelled is refused for good, unless the saga has a cancellation waiver."""
    verdict = cancel_flight_rule(trip.customer_id)
    if isinstance(verdict, Failed) and not await step.tx.fetchval(
            f"SELECT true FROM {SCHEMA}.cancellation_waivers WHERE saga_id = $1", step.saga_id):
        return verdict
    cancelled = await step.tx.fetch(
        f"""UPDATE {SCHEMA}.bookings SET status = 'cancelled', cancelled_at = now()
            WHERE saga_id = $1 AND step = $2 AND status = 'booked' RETURNING booking_id""",
        step.saga_id, step.step,
    )
    return Cancellation(cancelled_booking_ids=[row["booking_id"] for row in cancelled])
