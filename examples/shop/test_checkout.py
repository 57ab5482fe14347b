"""The checkout's tests: no Kafka, no Postgres, no clock; a few milliseconds each."""

import pytest

from examples.shop.checkout import Order, app, checkout, create_shipment, send_confirmation
from saga_orchestrator.testing import FaultCase, SagaEnvironment, fail, fail_transiently, fault_matrix

ORDER = Order(order_id="o-1", sku="SKU-1", quantity=1, amount_cents=999, address="1 Main St", email="a@shop.test")


async def test_an_order_completes() -> None:
    env = SagaEnvironment(app)
    result = await env.result(await env.start(checkout, ORDER))
    assert result.status == "COMPLETED" and result.succeeded[-1] == "send_confirmation"


async def test_no_shipment_gives_the_stock_and_the_payment_back() -> None:
    env = SagaEnvironment(app)
    env.script(create_shipment, fail("NoAddress"))
    result = await env.result(await env.start(checkout, ORDER))
    assert result.status == "COMPENSATED"
    assert sorted(result.compensated) == ["authorise_payment", "reserve_stock"]


async def test_a_full_mailbox_is_tried_again_until_the_mail_goes() -> None:
    env = SagaEnvironment(app)
    env.script(send_confirmation, fail_transiently(5))
    result = await env.result(await env.start(checkout, ORDER))
    assert result.status == "COMPLETED" and result.attempts("send_confirmation") == 6


@pytest.mark.parametrize("case", fault_matrix(checkout), ids=repr)
async def test_every_fault(case: FaultCase) -> None:
    await case.run(app, ORDER)
