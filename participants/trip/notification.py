"""Notification participant: ``send_itinerary`` (table notification.sent); it has no compensation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg
import orjson

from ..kit.bulk import record_each
from ..kit.effects import EffectTable
from ..kit.outcome import Failed, Outcome, Proceed, ReceivedCommand, Verdict
from ..kit.participant import Call, Participant
from .definition import TRIP_REQUEST

SCHEMA = "notification"

# Business rules (pure); their triggers are the demo's scenarios.
BOUNCE_DOMAIN = "@bounce.test"  # demo trigger: a mailbox that recovers after a few tries
BOUNCE_FAILURES = 3


def send_itinerary_rule(email: str, attempt: int) -> Verdict:
    """Mailboxes on the bounce domain are unavailable for the first BOUNCE_FAILURES attempts."""
    if email.endswith(BOUNCE_DOMAIN) and attempt <= BOUNCE_FAILURES:
        reason = f"mailbox {email} unavailable (attempt {attempt})"
        return Failed("MailboxUnavailable", reason, retryable=True)
    return Proceed()


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
    # What the itinerary said: the outputs of the steps before it (flight and hotel bookings, the charge).
    f"ALTER TABLE {SCHEMA}.sent ADD COLUMN IF NOT EXISTS itinerary jsonb NOT NULL DEFAULT '{{}}'",
)


SENT_COLUMNS = {"saga_id": "text", "step": "text", "idempotency_key": "text", "email": "text", "itinerary": "jsonb"}


async def send_itineraries(conn: asyncpg.Connection, calls: Sequence[Call]) -> list[Outcome]:
    """Send each itinerary to the customer's e-mail address (recorded as rows in notification.sent, one
    INSERT for all of them)."""
    verdicts = [send_itinerary_rule(trip["email"], command.attempt) for command, trip in calls]
    return await record_each(conn, calls, verdicts, f"{SCHEMA}.sent", SENT_COLUMNS, _sent, "sent_id")


def _sent(command: ReceivedCommand, trip: Mapping[str, Any]) -> tuple[str, ...]:
    return command.saga_id, command.step, command.idempotency_key, trip["email"], itinerary(command)


def itinerary(command: ReceivedCommand) -> str:
    """The itinerary a send_itinerary command describes, as JSON text: each earlier step's output by step name
    (the reference participants answer with JSON; anything else is kept as hex)."""
    return orjson.dumps({step: _readable(output) for step, output in command.step_outputs.items()}).decode()


def _readable(output: bytes) -> Any:
    try:
        return orjson.loads(output)
    except orjson.JSONDecodeError:
        return output.hex()


PARTICIPANT = Participant(
    name="notification",
    schema=SCHEMA,
    batch_handlers={"send_itinerary": send_itineraries},
    business_ddl=BUSINESS_DDL,
    input_types=frozenset({TRIP_REQUEST}),
    effects=EffectTable("sent", counts={"sent": None},
                        actions={"send_itinerary": "sent"}),
)
