"""Hotel participant: ``book_hotel`` and its compensation ``cancel_hotel`` (table hotel.bookings)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import asyncpg
import orjson

from participants.hotel.rules import book_hotel_rule
from participants.kit.outcome import Failed, Outcome, ReceivedCommand, Succeeded
from participants.kit.participant import Participant

SCHEMA = "hotel"
TRIP_REQUEST = "saga.v1.trip.TripRequest"

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


async def book_hotel(conn: asyncpg.Connection, command: ReceivedCommand, trip: Mapping[str, Any]) -> Outcome:
    """Book a room at the destination for the trip's dates."""
    verdict = book_hotel_rule(trip["destination"])
    if isinstance(verdict, Failed):
        return verdict
    booking_id = await conn.fetchval(
        f"""INSERT INTO {SCHEMA}.bookings (saga_id, step, idempotency_key, customer_id, destination,
                                           check_in, check_out, status)
            VALUES ($1, $2, $3, $4, $5, $6, $7, 'booked') RETURNING booking_id""",
        command.saga_id, command.step, command.idempotency_key, trip["customer_id"], trip["destination"],
        trip["depart_date"], trip["return_date"],
    )
    return Succeeded(orjson.dumps({"booking_id": booking_id}), reply_delay_ms=verdict.reply_delay_ms)


async def cancel_hotel(
    conn: asyncpg.Connection, command: ReceivedCommand, trip: Mapping[str, Any]
) -> Outcome:
    """Cancel the step's room; cancelling a booking that never happened succeeds as a no-op."""
    cancelled = await conn.fetch(
        f"""UPDATE {SCHEMA}.bookings SET status = 'cancelled', cancelled_at = now()
            WHERE saga_id = $1 AND step = $2 AND status = 'booked' RETURNING booking_id""",
        command.saga_id, command.step,
    )
    return Succeeded(orjson.dumps({"cancelled_booking_ids": [row["booking_id"] for row in cancelled]}))


PARTICIPANT = Participant(
    name="hotel",
    schema=SCHEMA,
    handlers={"book_hotel": book_hotel, "cancel_hotel": cancel_hotel},
    business_ddl=BUSINESS_DDL,
    input_types=frozenset({TRIP_REQUEST}),
)
