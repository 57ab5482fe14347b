"""Notification participant: ``send_itinerary`` (table notification.sent); it has no compensation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import asyncpg
import orjson

from participants.kit.outcome import Failed, Outcome, ReceivedCommand, Succeeded
from participants.kit.participant import Participant
from participants.notification.rules import send_itinerary_rule

SCHEMA = "notification"
TRIP_REQUEST = "saga.v1.trip.TripRequest"

BUSINESS_DDL = (
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.sent (
        sent_id bigserial PRIMARY KEY,
        saga_id text NOT NULL,
        step text NOT NULL,
        idempotency_key text NOT NULL UNIQUE,
        email text NOT NULL,
        sent_at timestamptz NOT NULL DEFAULT now()
    )""",
    f"CREATE INDEX IF NOT EXISTS sent_saga_step_idx ON {SCHEMA}.sent (saga_id, step)",
)


async def send_itinerary(
    conn: asyncpg.Connection, command: ReceivedCommand, trip: Mapping[str, Any]
) -> Outcome:
    """Send the itinerary to the customer's e-mail address (recorded as a row in notification.sent)."""
    verdict = send_itinerary_rule(trip["email"], command.attempt)
    if isinstance(verdict, Failed):
        return verdict
    sent_id = await conn.fetchval(
        f"""INSERT INTO {SCHEMA}.sent (saga_id, step, idempotency_key, email)
            VALUES ($1, $2, $3, $4) RETURNING sent_id""",
        command.saga_id, command.step, command.idempotency_key, trip["email"],
    )
    return Succeeded(orjson.dumps({"sent_id": sent_id}), reply_delay_ms=verdict.reply_delay_ms)


PARTICIPANT = Participant(
    name="notification",
    schema=SCHEMA,
    handlers={"send_itinerary": send_itinerary},
    business_ddl=BUSINESS_DDL,
    input_types=frozenset({TRIP_REQUEST}),
)
