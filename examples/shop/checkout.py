"""A shop's checkout: reserve stock ∥ authorise payment → create shipment (the pivot) → send confirmation."""

from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel

from saga_orchestrator.authoring import EffectTable, Saga, SagaApp, StepContext, StepFailed, participant


class Order(BaseModel):
    order_id: str
    sku: str
    quantity: int
    amount_cents: int
    address: str
    email: str


class Shipment(BaseModel):
    tracking: str


def ledger(schema: str) -> str:
    return f"CREATE TABLE IF NOT EXISTS {schema}.ledger (key text PRIMARY KEY, saga_id text, step text, state text)"


# Each participant's effects are rows of its ledger: what `saga effects` prints and `saga verify` checks.
LEDGER = EffectTable("ledger", counts={"done": None, "undone": "state = 'released'"})
inventory, payments, shipping, mail = (participant(name, tables=[ledger(name)], effects=LEDGER)
                                       for name in ("inventory", "payments", "shipping", "mail"))


async def note(step: StepContext, state: str) -> None:
    await step.tx.execute(f"INSERT INTO {step.schema}.ledger VALUES ($1, $2, $3, $4)", step.idempotency_key,
                          step.saga_id, step.step, state)


async def release(step: StepContext) -> None:
    await step.tx.execute(f"UPDATE {step.schema}.ledger SET state = 'released' WHERE saga_id = $1", step.saga_id)


@inventory.action(effect="done")
async def reserve_stock(step: StepContext, order: Order) -> None:
    if order.quantity > 10:
        raise StepFailed("OutOfStock", f"only 10 of {order.sku} left")
    await note(step, "reserved")


@reserve_stock.undo(effect="undone")
async def release_stock(step: StepContext, order: Order) -> None:
    await release(step)


@payments.action(effect="done")
async def authorise_payment(step: StepContext, order: Order) -> None:
    if order.amount_cents > 100_000:
        raise StepFailed("LimitExceeded", "over the card's limit")
    await note(step, "authorised")


@authorise_payment.undo(effect="undone")
async def void_authorisation(step: StepContext, order: Order) -> None:
    await release(step)


@shipping.action(effect="done")
async def create_shipment(step: StepContext, order: Order) -> Shipment:
    if not order.address.strip():
        raise StepFailed("NoAddress", "the order has no address")
    await note(step, "created")
    return Shipment(tracking=f"TRK-{order.order_id}")


@mail.action(effect="done")
async def send_confirmation(step: StepContext, order: Order, shipment: Shipment) -> None:
    if order.email.endswith("@bounce.test") and step.attempt < 3:
        raise StepFailed("MailboxFull", "try again later", retryable=True)
    await note(step, f"sent {shipment.tracking}")


checkout = Saga("checkout", input=Order, searchable=("order_id", "email"))
stock = checkout.step(reserve_stock, timeout=timedelta(seconds=2))
payment = checkout.step(authorise_payment, timeout=timedelta(seconds=2))
shipment = checkout.step(create_shipment, after=[stock, payment], pivot=True)
checkout.step(send_confirmation, after=[shipment])

app = SagaApp(sagas=[checkout], participants=[inventory, payments, shipping, mail],
              schema_folder=Path(__file__).parent / "schemas")
