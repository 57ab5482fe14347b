"""A second saga type written only with the public building blocks: a definition and kit participants.

checkout: reserve inventory ∥ authorize payment → ship. Triggers: sku "SKU-GONE" → OutOfStock (definitive);
address "nowhere" → Undeliverable (definitive) after both earlier steps, so both are compensated; address
"hold" → shipping asks a human and defers its answer (``saga answer`` gives it; the ship step waits 30 s).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import asyncpg

from saga_orchestrator.orchestrator.domain.definition import RetryPolicy, SagaDefinition, Step
from saga_orchestrator.participants.kit.outcome import Deferred, Failed, Outcome, ReceivedCommand, Succeeded
from saga_orchestrator.participants.kit.participant import Participant

SCHEMA_DIR = Path(__file__).parent / "checkout_schemas"
CHECKOUT_REQUEST = "saga.v1.checkout.CheckoutRequest"
FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff_ms=100, max_backoff_ms=1_000)

CHECKOUT = SagaDefinition(
    saga_type="checkout",
    version=1,
    input_schema=CHECKOUT_REQUEST,
    steps=(
        Step(name="reserve_inventory", participant="inventory", command="reserve_stock",
             compensation="release_stock", retry=FAST_RETRY, timeout_ms=2_000),
        Step(name="authorize_payment", participant="billing", command="authorize",
             compensation="void_authorization", retry=FAST_RETRY, timeout_ms=2_000),
        Step(name="ship", participant="shipping", command="ship_order",
             depends_on=("reserve_inventory", "authorize_payment"), retry=FAST_RETRY, timeout_ms=30_000),
    ),
)


def _ledger_ddl(schema: str) -> tuple[str, ...]:
    return (f"""CREATE TABLE IF NOT EXISTS {schema}.ledger (
                    idempotency_key text PRIMARY KEY, saga_id text NOT NULL, status text NOT NULL)""",)


def _record(schema: str, status: str) -> Any:
    async def handler(conn: asyncpg.Connection, command: ReceivedCommand, order: Mapping[str, Any]) -> Outcome:
        await conn.execute(f"INSERT INTO {schema}.ledger VALUES ($1, $2, $3)",
                           command.idempotency_key, command.saga_id, status)
        return Succeeded(f"{schema}:{status}".encode())
    return handler


def _release(schema: str) -> Any:
    async def handler(conn: asyncpg.Connection, command: ReceivedCommand, order: Mapping[str, Any]) -> Outcome:
        await conn.execute(f"UPDATE {schema}.ledger SET status = 'released' WHERE saga_id = $1 AND status <> "
                           "'released'", command.saga_id)
        return Succeeded()
    return handler


async def _reserve(conn: asyncpg.Connection, command: ReceivedCommand, order: Mapping[str, Any]) -> Outcome:
    if order["sku"] == "SKU-GONE":
        return Failed("OutOfStock", f"no stock of {order['sku']}")
    return await _record("inventory", "reserved")(conn, command, order)  # type: ignore[no-any-return]


async def _ship(conn: asyncpg.Connection, command: ReceivedCommand, order: Mapping[str, Any]) -> Outcome:
    if order["address"] == "nowhere":
        return Failed("Undeliverable", "no such address")
    if order["address"] == "hold":
        await _record("shipping", "held")(conn, command, order)
        return Deferred()
    return await _record("shipping", "shipped")(conn, command, order)  # type: ignore[no-any-return]


INVENTORY = Participant(name="inventory", schema="inventory",
                        handlers={"reserve_stock": _reserve, "release_stock": _release("inventory")},
                        business_ddl=_ledger_ddl("inventory"), input_types=frozenset({CHECKOUT_REQUEST}))
BILLING = Participant(name="billing", schema="billing",
                      handlers={"authorize": _record("billing", "authorized"),
                                "void_authorization": _release("billing")},
                      business_ddl=_ledger_ddl("billing"), input_types=frozenset({CHECKOUT_REQUEST}))
SHIPPING = Participant(name="shipping", schema="shipping", handlers={"ship_order": _ship},
                       business_ddl=_ledger_ddl("shipping"), input_types=frozenset({CHECKOUT_REQUEST}))
