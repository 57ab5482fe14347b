"""``ParticipantHarness``: a typed participant's real handlers through the kit's transaction path on a real Postgres,
without Kafka. A redelivery is answered from the record, a failed step leaves no row, a compensation undoes, and
a step's typed output reaches the handler that needs it."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import pytest
from pydantic import BaseModel

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
from saga_orchestrator.authoring import Calling, EffectTable, StepContext, participant
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
        assert await harness.effects("o-1") == {"done": 1, "undone": 0}  # as saga effects / saga verify count it
        assert await harness.effects("o-2") == {"done": 0, "undone": 0}

        undone = await harness.send(release_stock, ORDER, saga_id="o-1")
        assert undone.status == "SUCCEEDED"
        assert await harness.pool.fetchval("SELECT state FROM inventory.ledger WHERE saga_id = 'o-1'") == "released"
        assert await harness.effects("o-1") == {"done": 1, "undone": 1}


async def test_a_typed_output_is_encoded_and_reaches_the_handler_that_needs_it(database_url: str) -> None:
    async with ParticipantHarness(shipping, database_url, saga_type="checkout") as harness:
        created = await harness.send(create_shipment, ORDER, saga_id="o-3")
        assert created.output == Shipment(tracking="TRK-o-1") and created.held_ms == 0
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


class Receipt(BaseModel):
    text: str


courier = participant("courier", tables=["CREATE TABLE IF NOT EXISTS courier.drops (saga_id text, step text)"],
                      effects=EffectTable("drops", counts={"dropped": None}))


@courier.action(effect="dropped")
async def deliver(step: StepContext, order: Order, shipment: Shipment) -> Receipt:
    step.hold_reply(3_000)  # the courier confirms late
    await step.tx.execute("INSERT INTO courier.drops VALUES ($1, $2)", step.saga_id, step.step)
    return Receipt(text=f"{','.join(step.outputs)}: {step.outputs['create_shipment'] == shipment}")


async def test_a_handler_sees_its_outputs_by_step_and_can_hold_its_reply(database_url: str) -> None:
    async with ParticipantHarness(courier, database_url, saga_type="checkout", records=shipping.records()) as harness:
        reply = await harness.send(deliver, ORDER, saga_id="o-6", outputs={"create_shipment": Shipment(tracking="T")})
        assert reply.output == Receipt(text="create_shipment: True")
        assert 2_500 <= reply.held_ms <= 3_500, reply
        assert await harness.effects("o-6") == {"dropped": 1}


def test_an_effect_that_is_not_a_count_of_the_table_is_refused_where_it_is_written() -> None:
    with pytest.raises(ValueError, match="effect 'delivered' is not a count of the participant's effects"):
        courier.action(name="redeliver", effect="delivered")(deliver.handler)


class Manifest(BaseModel):
    parcels: int


depot = participant("depot", tables=["CREATE TABLE IF NOT EXISTS depot.loads (saga_id text, step text, tracking text)"],
                    effects=EffectTable("loads", counts={"loaded": None}))


@depot.action(many=True, needs=[Shipment], effect="loaded")
async def load_vans(tx: asyncpg.Connection, calls: Sequence[Calling[Order]]) -> list[Manifest]:
    """A batch action: one INSERT for every call of the batch, each call's shipment from the step before."""
    await tx.executemany("INSERT INTO depot.loads VALUES ($1, $2, $3)",
                         [(c.step.saga_id, c.step.step, c.output(Shipment).tracking) for c in calls])
    return [Manifest(parcels=c.input.quantity) for c in calls]


async def test_a_batch_action_gets_the_outputs_it_needs_and_refuses_a_call_without_them(database_url: str) -> None:
    async with ParticipantHarness(depot, database_url, saga_type="checkout", records=shipping.records()) as harness:
        van = {"create_shipment": Shipment(tracking="V")}
        loaded = await harness.send(load_vans, ORDER, saga_id="o-8", outputs=van)
        assert (loaded.status, loaded.output) == ("SUCCEEDED", Manifest(parcels=1))
        assert await harness.pool.fetchval("SELECT tracking FROM depot.loads WHERE saga_id = 'o-8'") == "V"
        missing = await harness.send(load_vans, ORDER, saga_id="o-9")
        assert (missing.status, missing.error_type) == ("FAILED", "MissingOutput")
        assert await harness.effects("o-9") == {"loaded": 0}


def test_needs_is_for_a_batch_action_only() -> None:
    with pytest.raises(TypeError, match="needs= is for a batch action"):
        depot.action(name="single", needs=[Shipment])(deliver.handler)
