"""Payment participant: ``charge_card`` and its compensation ``refund_card`` (table payment.charges)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import asyncpg
import orjson

from participants.kit.outcome import Failed, Outcome, ReceivedCommand, Succeeded
from participants.kit.participant import Participant
from participants.payment.rules import charge_card_rule

SCHEMA = "payment"
TRIP_REQUEST = "saga.v1.trip.TripRequest"

BUSINESS_DDL = (
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.charges (
        charge_id bigserial PRIMARY KEY,
        saga_id text NOT NULL,
        step text NOT NULL,
        idempotency_key text NOT NULL UNIQUE,
        customer_id text NOT NULL,
        amount_cents bigint NOT NULL,
        currency text NOT NULL,
        status text NOT NULL CHECK (status IN ('charged', 'refunded')),
        charged_at timestamptz NOT NULL DEFAULT now(),
        refunded_at timestamptz
    )""",
    f"CREATE INDEX IF NOT EXISTS charges_saga_step_idx ON {SCHEMA}.charges (saga_id, step)",
)


async def charge_card(conn: asyncpg.Connection, command: ReceivedCommand, trip: Mapping[str, Any]) -> Outcome:
    """Charge the trip's amount to the card (card tokens trigger decline / flaky / slow behaviours)."""
    verdict = charge_card_rule(trip["card_token"], command.attempt)
    if isinstance(verdict, Failed):
        return verdict
    charge_id = await conn.fetchval(
        f"""INSERT INTO {SCHEMA}.charges (saga_id, step, idempotency_key, customer_id, amount_cents,
                                          currency, status)
            VALUES ($1, $2, $3, $4, $5, $6, 'charged') RETURNING charge_id""",
        command.saga_id, command.step, command.idempotency_key, trip["customer_id"], trip["amount_cents"],
        trip["currency"],
    )
    return Succeeded(orjson.dumps({"charge_id": charge_id}), reply_delay_ms=verdict.reply_delay_ms)


async def refund_card(conn: asyncpg.Connection, command: ReceivedCommand, trip: Mapping[str, Any]) -> Outcome:
    """Refund the step's charge; refunding a charge that never happened succeeds as a no-op."""
    refunded = await conn.fetch(
        f"""UPDATE {SCHEMA}.charges SET status = 'refunded', refunded_at = now()
            WHERE saga_id = $1 AND step = $2 AND status = 'charged' RETURNING charge_id""",
        command.saga_id, command.step,
    )
    return Succeeded(orjson.dumps({"refunded_charge_ids": [row["charge_id"] for row in refunded]}))


PARTICIPANT = Participant(
    name="payment",
    schema=SCHEMA,
    handlers={"charge_card": charge_card, "refund_card": refund_card},
    business_ddl=BUSINESS_DDL,
    input_types=frozenset({TRIP_REQUEST}),
)
