"""Flight participant: ``book_flight`` and its compensation ``cancel_flight`` (table flight.bookings)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg
import orjson

from ..kit.bulk import record_each
from ..kit.effects import EffectTable
from ..kit.outcome import Failed, Outcome, Proceed, ReceivedCommand, Succeeded, Verdict
from ..kit.participant import Call, Participant
from .definition import TRIP_REQUEST

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


BOOKING_COLUMNS = {"saga_id": "text", "step": "text", "idempotency_key": "text", "customer_id": "text",
                   "origin": "text", "destination": "text", "depart_date": "text", "return_date": "text",
                   "status": "text"}


async def book_flights(conn: asyncpg.Connection, calls: Sequence[Call]) -> list[Outcome]:
    """Book the trip's flight for each saga step (one INSERT for all of them)."""
    verdicts = [book_flight_rule(trip["origin"], trip["destination"]) for _, trip in calls]
    return await record_each(conn, calls, verdicts, f"{SCHEMA}.bookings", BOOKING_COLUMNS, _booking, "booking_id")


def _booking(command: ReceivedCommand, trip: Mapping[str, Any]) -> tuple[str, ...]:
    return (command.saga_id, command.step, command.idempotency_key, trip["customer_id"], trip["origin"],
            trip["destination"], trip["depart_date"], trip["return_date"], "booked")


async def cancel_flight(
    conn: asyncpg.Connection, command: ReceivedCommand, trip: Mapping[str, Any]
) -> Outcome:
    """Cancel the step's booking; a booking that never happened is already 'cancelled' (no-op). A fare that
    cannot be cancelled is refused for good, unless the saga has a cancellation waiver."""
    verdict = cancel_flight_rule(trip["customer_id"])
    if isinstance(verdict, Failed) and not await conn.fetchval(
            f"SELECT true FROM {SCHEMA}.cancellation_waivers WHERE saga_id = $1", command.saga_id):
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
    handlers={"cancel_flight": cancel_flight},
    batch_handlers={"book_flight": book_flights},
    business_ddl=BUSINESS_DDL,
    input_types=frozenset({TRIP_REQUEST}),
    effects=EffectTable("bookings", counts={"booked": None, "cancelled": "status = 'cancelled'"},
                        actions={"book_flight": "booked", "cancel_flight": "cancelled"}),
)
