"""Flight participant: ``book_flight`` and its compensation ``cancel_flight`` (table flight.bookings)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import asyncpg
import orjson

from participants.flight.rules import book_flight_rule, cancel_flight_rule
from participants.kit.outcome import Failed, Outcome, ReceivedCommand, Succeeded
from participants.kit.participant import Participant

SCHEMA = "flight"
TRIP_REQUEST = "saga.v1.trip.TripRequest"

# (saga_id, step) is deliberately not unique: a second booking for one step would be a double effect
# that effects_by_idempotency_key_counts must be able to see.
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
)


async def book_flight(conn: asyncpg.Connection, command: ReceivedCommand, trip: Mapping[str, Any]) -> Outcome:
    """Book the trip's flight for this saga step."""
    verdict = book_flight_rule(trip["origin"], trip["destination"])
    if isinstance(verdict, Failed):
        return verdict
    booking_id = await conn.fetchval(
        f"""INSERT INTO {SCHEMA}.bookings (saga_id, step, idempotency_key, customer_id, origin, destination,
                                           depart_date, return_date, status)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'booked') RETURNING booking_id""",
        command.saga_id, command.step, command.idempotency_key, trip["customer_id"], trip["origin"],
        trip["destination"], trip["depart_date"], trip["return_date"],
    )
    return Succeeded(orjson.dumps({"booking_id": booking_id}), reply_delay_ms=verdict.reply_delay_ms)


async def cancel_flight(
    conn: asyncpg.Connection, command: ReceivedCommand, trip: Mapping[str, Any]
) -> Outcome:
    """Cancel the step's booking; a booking that never happened is already 'cancelled' (no-op)."""
    verdict = cancel_flight_rule(trip["customer_id"])
    if isinstance(verdict, Failed):
        return verdict
    cancelled = await conn.fetch(
        f"""UPDATE {SCHEMA}.bookings SET status = 'cancelled', cancelled_at = now()
            WHERE saga_id = $1 AND step = $2 AND status = 'booked' RETURNING booking_id""",
        command.saga_id, command.step,
    )
    return Succeeded(orjson.dumps({"cancelled_booking_ids": [row["booking_id"] for row in cancelled]}))


PARTICIPANT = Participant(
    name="flight",
    schema=SCHEMA,
    handlers={"book_flight": book_flight, "cancel_flight": cancel_flight},
    business_ddl=BUSINESS_DDL,
    input_types=frozenset({TRIP_REQUEST}),
)
