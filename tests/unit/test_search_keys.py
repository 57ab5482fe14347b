"""A saga type's searchable input fields: checked where they are declared, indexed once when a saga starts."""

from __future__ import annotations

import re

import pytest
from pydantic import BaseModel

from examples.shop.checkout import Order, app, checkout
from saga_orchestrator.authoring import Saga
from saga_orchestrator.orchestrator.domain.errors import DefinitionError
from saga_orchestrator.orchestrator.ports import SearchKey
from saga_orchestrator.testing import SagaEnvironment

ORDER = Order(order_id="o-77", sku="SKU-1", quantity=1, amount_cents=999, address="1 Main St", email="a@shop.test")


class Request(BaseModel):
    customer_id: str
    seats: int
    notes: list[str]


async def test_a_started_saga_is_indexed_by_its_searchable_fields_once() -> None:
    env = SagaEnvironment(app)
    saga_id = await env.start(checkout, ORDER)
    await env.result(saga_id)
    assert env.store.search_keys == {SearchKey(saga_id, "order_id", "o-77"), SearchKey(saga_id, "email", "a@shop.test")}
    assert checkout.definition.searchable == ("order_id", "email")


@pytest.mark.parametrize(("fields", "error"), [
    (("customer",), "searchable field 'customer' is not a field of Request (its fields: customer_id, seats, notes)"),
    (("notes",), "searchable field 'notes' must hold text, a whole number or a boolean"),
    (("seats", "seats"), "a searchable field is named twice in ['seats', 'seats']"),
])
def test_a_searchable_field_must_be_a_plain_field_of_the_input(fields: tuple[str, ...], error: str) -> None:
    with pytest.raises(DefinitionError, match="^" + re.escape(f"saga 'booking': {error}")):
        Saga("booking", input=Request, searchable=fields)


async def test_a_starting_sagas_input_is_decoded_once_by_the_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    env = SagaEnvironment(app)
    decoded: list[bytes] = []
    decode = env.schemas.decode

    def counting(data: bytes) -> tuple[str, dict[str, object]]:
        decoded.append(data)
        return decode(data)

    monkeypatch.setattr(env.schemas, "decode", counting)
    saga_id = await env.start(checkout, ORDER)
    assert env.store.search_keys == {SearchKey(saga_id, "order_id", "o-77"), SearchKey(saga_id, "email", "a@shop.test")}
    inputs = [data for data in decoded if decode(data)[0] == checkout.definition.input_schema]
    assert len(inputs) == 1  # by the parser, which hands the record on to the service's index
