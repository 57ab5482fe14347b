"""Apps of the shop checkout's parts: put together wrong, each one way, for the start-up refusals; and a patient one."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel

from examples.loans.loan import LEDGER as LOAN_LEDGER
from examples.loans.loan import Application, Approval, disburse, hold_funds, notices, notify_applicant, treasury
from examples.loans.loan import ledger as loan_ledger
from examples.loans.loan import note as loan_note
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
from saga_orchestrator.authoring import (
    UNLIMITED_RETRY,
    Deferred,
    Expiry,
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


def order(saga_id: str, address: str = "1 Main St") -> Order:
    """A checkout's order of one item for ``saga_id``, delivered to ``address`` (see ``book_courier``)."""
    return Order(order_id=saga_id, sku="SKU-1", quantity=1, amount_cents=999, address=address, email="a@b.test")


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


# -- waits: the loan's parts with a short wait for its approval, and a loan whose review a person gives -----------

quick_loan = Saga("quick_loan", input=Application, namespace="saga.v1.loan")
quick_approval = quick_loan.signal(Approval)
_held = quick_loan.step(hold_funds, timeout=timedelta(seconds=5))
_approved = quick_loan.wait(quick_approval, after=[_held], timeout=timedelta(seconds=8), on_expiry=Expiry.FAIL)
_paid = quick_loan.step(disburse, after=[_approved], pivot=True, timeout=timedelta(seconds=5))
quick_loan.step(notify_applicant, after=[_paid])


class Review(BaseModel):
    score: int
    reviewer: str


reviews = participant("reviews", tables=[loan_ledger("reviews")], effects=LOAN_LEDGER)


@reviews.action(effect="done")
async def ask_review(step: StepContext, application: Application) -> Review | Deferred:
    """A person reviews the application: `saga answer reviews KEY --output '{"score": 4, "reviewer": "..."}'`."""
    await loan_note(step, "asked")
    return Deferred()


@reviews.action(effect="done")
async def file_review(step: StepContext, application: Application, review: Review) -> None:
    await loan_note(step, f"scored {review.score} by {review.reviewer}")


reviewed_loan = Saga("reviewed_loan", input=Application, namespace="saga.v1.loan")
_asked = reviewed_loan.step(ask_review, timeout=timedelta(minutes=10))
reviewed_loan.step(file_review, after=[_asked])

WAITS = SagaApp(sagas=[quick_loan, reviewed_loan], participants=[treasury, notices, reviews],
                schema_folder=Path(__file__).parent / "waits_schemas")
"""The loan with an 8 s wait for its approval (tests/e2e/test_signals.py), and a loan whose review a person
gives as the typed output of a deferred action (`saga answer`), which the next step takes as its parameter. Its
records (the loan's, and the review) are in tests/e2e/waits_schemas."""
