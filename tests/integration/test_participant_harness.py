"""``ParticipantHarness``: a typed participant's real handlers through the kit's transaction path on a real Postgres,
without Kafka. A redelivery is answered from the record, a failed step leaves no row, a compensation undoes, and
a step's typed output reaches the handler that needs it."""

from __future__ import annotations

import pytest

from examples.shop.checkout import (
    Order,
    Shipment,
    create_shipment,
    inventory,
    mail,
    release_stock,
    reserve_stock,
    send_confirmation,
    shipping,
)
from saga_orchestrator.testing import ParticipantHarness

pytestmark = pytest.mark.integration

ORDER = Order(order_id="o-1", sku="SKU-1", quantity=1, amount_cents=999, address="1 Main St", email="a@shop.test")


async def test_a_redelivery_is_answered_from_the_record_and_a_failed_step_leaves_no_row(database_url: str) -> None:
    async with ParticipantHarness(inventory, database_url, saga_type="checkout") as harness:
        reply = await harness.send(reserve_stock, ORDER, saga_id="o-1")
        assert (reply.disposition, reply.status) == ("recorded", "SUCCEEDED")
        assert await harness.send(reserve_stock, ORDER, saga_id="o-1") == reply.again()
        refused = await harness.send(reserve_stock, ORDER.model_copy(update={"quantity": 50}), saga_id="o-2")
        assert (refused.status, refused.error_type) == ("FAILED", "OutOfStock")
        rows = await harness.pool.fetch("SELECT saga_id, state FROM inventory.ledger ORDER BY saga_id")
        assert [(row["saga_id"], row["state"]) for row in rows] == [("o-1", "reserved")]  # once; none for o-2

        undone = await harness.send(release_stock, ORDER, saga_id="o-1")
        assert undone.status == "SUCCEEDED"
        assert await harness.pool.fetchval("SELECT state FROM inventory.ledger WHERE saga_id = 'o-1'") == "released"


async def test_a_typed_output_is_encoded_and_reaches_the_handler_that_needs_it(database_url: str) -> None:
    async with ParticipantHarness(shipping, database_url, saga_type="checkout") as harness:
        created = await harness.send(create_shipment, ORDER, saga_id="o-3")
        assert created.output == Shipment(tracking="TRK-o-1")
    async with ParticipantHarness(mail, database_url, saga_type="checkout", records=shipping.records()) as harness:
        sent = await harness.send(send_confirmation, ORDER, saga_id="o-3", outputs={"create_shipment": created.output})
        assert sent.status == "SUCCEEDED"
        assert await harness.pool.fetchval("SELECT state FROM mail.ledger WHERE saga_id = 'o-3'") == "sent TRK-o-1"
        missing = await harness.send(send_confirmation, ORDER, saga_id="o-4")
        assert (missing.status, missing.error_type) == ("FAILED", "MissingOutput")


async def test_a_retryable_failure_is_not_recorded_so_a_later_attempt_does_the_work(database_url: str) -> None:
    bouncing = ORDER.model_copy(update={"email": "a@bounce.test"})
    async with ParticipantHarness(mail, database_url, saga_type="checkout", records=shipping.records()) as harness:
        outputs = {"create_shipment": Shipment(tracking="T-5")}
        first = await harness.send(send_confirmation, bouncing, saga_id="o-5", outputs=outputs)
        assert (first.disposition, first.retryable) == ("transient", True)
        third = await harness.send(send_confirmation, bouncing, saga_id="o-5", attempt=3, outputs=outputs)
        assert (third.disposition, third.status) == ("recorded", "SUCCEEDED")
        assert await harness.pool.fetchval("SELECT count(*) FROM mail.ledger WHERE saga_id = 'o-5'") == 1
