"""Payment participant: ``charge_card`` and its compensation ``refund_card`` (table payment.charges), and
``check_fraud``, a check a trip may run before its charge (the trip runs without it; a changed trip adds it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from ..kit.batch_rows import record_calls
from ..kit.effects import EffectTable
from ..kit.outcome import Failed, Proceed, StepFailed, Verdict
from ..kit.typed import Calling, StepContext, participant
from .records import Charge, Refund, TripRequest

SCHEMA = "payment"

# Business rules (pure); their triggers are the demo's scenarios.
DECLINED_TOKEN = "tok_declined"  # charge fails for good
FLAGGED_TOKEN = "tok_flagged"  # the fraud check refuses the card
FLAKY_TOKEN = "tok_flaky"  # charge fails transiently on the first FLAKY_FAILURES attempts
SLOW_TOKEN = "tok_slow"  # first attempt charges but its answer arrives after the step timeout
FLAKY_FAILURES = 2
# Longer than the trip saga's payment step timeout (2 s), with room for the timer to fire late on a loaded
# machine (it fired 1.0 s late in a full test run), so the orchestrator records the step timed out and,
# the command having been picked up in time, waits for its answer rather than charging again.
SLOW_REPLY_DELAY_MS = 4000


def charge_card_rule(card_token: str, attempt: int) -> Verdict:
    """Whether a charge goes ahead on this attempt, and how long its reply is held back."""
    if card_token == DECLINED_TOKEN:
        return Failed("CardDeclined", "the issuer declined the card")
    if card_token == FLAKY_TOKEN and attempt <= FLAKY_FAILURES:
        return Failed("CardNetworkTimeout", f"card network timed out (attempt {attempt})", retryable=True)
    if card_token == SLOW_TOKEN and attempt == 1:
        return Proceed(reply_delay_ms=SLOW_REPLY_DELAY_MS)
    return Proceed()


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

payment = participant("payment", tables=BUSINESS_DDL,
                      effects=EffectTable("charges", counts={"charged": None, "refunded": "status = 'refunded'"}))

CHARGE_COLUMNS = {"saga_id": "text", "step": "text", "idempotency_key": "text", "customer_id": "text",
                  "amount_cents": "bigint", "currency": "text", "status": "text"}


@payment.action(many=True, effect="charged")
async def charge_card(tx: asyncpg.Connection, calls: Sequence[Calling[TripRequest]]) -> list[Charge | Failed]:
    """Charge each trip's amount to its card (card tokens trigger decline / flaky / slow behaviours), one
    INSERT for all of them."""
    verdicts = [charge_card_rule(call.input.card_token, call.step.attempt) for call in calls]
    return await record_calls(tx, calls, verdicts, f"{SCHEMA}.charges", CHARGE_COLUMNS, _charge, Charge)


def _charge(call: Calling[TripRequest]) -> tuple[Any, ...]:
    trip = call.input
    return (call.step.saga_id, call.step.step, call.step.idempotency_key, trip.customer_id, trip.amount_cents,
            trip.currency, "charged")


@payment.action
async def check_fraud(step: StepContext, trip: TripRequest) -> None:
    """Refuse a card the fraud rules flag, before anything is charged to it; it changes nothing."""
    if trip.card_token == FLAGGED_TOKEN:
        raise StepFailed("CardFlagged", f"card {trip.card_token} is flagged for fraud")


@charge_card.undo(effect="refunded")
async def refund_card(step: StepContext, trip: TripRequest) -> Refund:
    """Refund the step's charge; refunding a charge that never happened succeeds as a no-op."""
    refunded = await step.tx.fetch(
        f"""UPDATE {SCHEMA}.charges SET status = 'refunded', refunded_at = now()
            WHERE saga_id = $1 AND step = $2 AND status = 'charged' RETURNING charge_id""",
        step.saga_id, step.step,
    )
    return Refund(refunded_charge_ids=[row["charge_id"] for row in refunded])
