"""Apps of the shop checkout's parts: put together wrong, each one way, for the start-up refusals; and a patient one."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from examples.shop.checkout import (
    LEDGER,
    Order,
    app,
    authorise_payment,
    checkout,
    create_shipment,
    inventory,
    ledger,
    mail,
    note,
    payments,
    reserve_stock,
    send_confirmation,
    shipping,
)
from saga_orchestrator.orchestrator.authoring import (
    UNLIMITED_RETRY,
    Deferred,
    RetryPolicy,
    Saga,
    SagaApp,
    StepContext,
    StepFailed,
    participant,
)

NOBODY_SHIPS = SagaApp(sagas=[checkout], participants=[inventory, payments, mail], schema_folder=app.schema_folder)
"""The checkout sends to participant shipping, which no participant of this app serves."""

shipping_elsewhere = participant("shipping")


@shipping_elsewhere.action
async def hand_over(step: StepContext, order: Order) -> None:
    return None


SHIPS_OTHERWISE = SagaApp(sagas=[checkout], participants=[inventory, payments, shipping_elsewhere, mail],
                          schema_folder=app.schema_folder)
"""The checkout names action create_shipment of participant shipping, which this shipping lacks."""

NOT_WRITTEN = SagaApp(sagas=[checkout], participants=[inventory, payments, shipping, mail],
                      schema_folder=Path(__file__).parent / "no_schemas_here")
"""Its records were never written to its schema folder."""

patient = Saga("patient_checkout", input=Order, namespace="saga.v1.checkout")
_stock = patient.step(reserve_stock)
_payment = patient.step(authorise_payment)
_shipment = patient.step(create_shipment, after=[_stock, _payment], pivot=True)
patient.step(send_confirmation, after=[_shipment], skippable=True,
             retry=RetryPolicy(max_attempts=None, initial_backoff_ms=3_600_000, max_backoff_ms=3_600_000))

courier = participant("courier", tables=[ledger("courier")], effects=LEDGER)


@courier.action(effect="done")
async def book_courier(step: StepContext, order: Order) -> Deferred | None:
    """Address "ask": a person books the courier (`saga answer`); "unmapped": no courier the first time, for good
    (the map is fixed before the saga is re-driven), booked on a later attempt."""
    if order.address == "unmapped" and step.attempt == 1:
        raise StepFailed("NoCourier", "no courier serves this address yet")
    await note(step, "booked")
    return Deferred() if order.address == "ask" else None


redrivable = Saga("courier_checkout", input=Order, namespace="saga.v1.checkout")
_stock_c = redrivable.step(reserve_stock)
_payment_c = redrivable.step(authorise_payment)
_shipment_c = redrivable.step(create_shipment, after=[_stock_c, _payment_c], pivot=True)
redrivable.step(book_courier, after=[_shipment_c], retry=UNLIMITED_RETRY, timeout=timedelta(minutes=10))


PATIENT = SagaApp(sagas=[patient], participants=[inventory, payments, shipping, mail], schema_folder=app.schema_folder)
"""The checkout with an hour between the confirmation's attempts (a full mailbox is tried again hourly): a saga
that waits on a retry backoff long enough for an operator to pull a lever; the confirmation may be skipped."""

LEVERS = SagaApp(sagas=[patient, redrivable], participants=[inventory, payments, shipping, mail, courier],
                 schema_folder=app.schema_folder)
"""PATIENT and a checkout that books a courier after the shipment (its pivot): failing for good after the pivot
(a Redrive runs it again), or waiting for a person's answer (`saga answer`)."""
