"""Notification participant: ``send_itinerary`` (table notification.sent); it has no compensation."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import orjson

from ..kit.batch_rows import record_calls
from ..kit.effects import EffectTable
from ..kit.outcome import Failed, Proceed, Verdict
from ..kit.typed import Calling, participant
from .records import Charge, FlightBooking, HotelBooking, Itinerary, TripRequest

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

notification = participant("notification", tables=BUSINESS_DDL,
                           effects=EffectTable("sent", counts={"sent": None}))

SENT_COLUMNS = {"saga_id": "text", "step": "text", "idempotency_key": "text", "email": "text", "itinerary": "jsonb"}


# Each may be missing: a trip started before its steps' outputs were typed records carries them as JSON bytes,
# which are not decoded; its itinerary then lists what is there.
@notification.action(many=True, effect="sent", needs=[FlightBooking | None, HotelBooking | None, Charge | None])
async def send_itinerary(tx: asyncpg.Connection, calls: Sequence[Calling[TripRequest]]) -> list[Itinerary | Failed]:
    """Send each itinerary, with the bookings and the charge, to the customer's e-mail address (recorded as rows
    in notification.sent, one INSERT for all of them)."""
    verdicts = [send_itinerary_rule(call.input.email, call.step.attempt) for call in calls]
    return await record_calls(tx, calls, verdicts, f"{SCHEMA}.sent", SENT_COLUMNS, _sent, Itinerary)


def _sent(call: Calling[TripRequest]) -> tuple[str, ...]:
    return (call.step.saga_id, call.step.step, call.step.idempotency_key, call.input.email, itinerary(call))


def itinerary(call: Calling[TripRequest]) -> str:
    """What an itinerary describes, as JSON text: each earlier step's output it was given, by step name."""
    return orjson.dumps({step: output.model_dump() for step, output in call.step.outputs.items()}).decode()
