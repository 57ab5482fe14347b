"""The reference trip changed as a team might change it while trips run, for the deploy checks (their tests,
and the bench of the replay check): each a definition to name in SAGA_DEFINITIONS (``bench.trip_changes:NAME``)."""

from __future__ import annotations

import dataclasses

from saga_orchestrator.orchestrator.domain.definition import Expiry, RetryPolicy, SagaDefinition, Step
from saga_orchestrator.participants.trip import TRIP


def _edited(**steps: Step | None) -> tuple[Step, ...]:
    """The trip's steps with those named replaced (None: removed)."""
    kept = tuple(steps.get(step.name, step) for step in TRIP.steps)
    return tuple(step for step in kept if step is not None)


CHECK_BEFORE_CHARGE = dataclasses.replace(TRIP, steps=(
    *_edited(charge_card=dataclasses.replace(TRIP.step("charge_card"), depends_on=("fraud_check",))),
    Step(name="fraud_check", participant="payment", command="check_fraud", depends_on=("book_flight", "book_hotel"))))
"""v1 edited in place: a fraud check before the charge."""

FRAUD_CHECK_PATCH = "fraud-check"
FRAUD_CHECKED = dataclasses.replace(TRIP, steps=(
    *_edited(charge_card=dataclasses.replace(TRIP.step("charge_card"), depends_on=("fraud_check",))),
    Step(name="fraud_check", participant="payment", command="check_fraud", depends_on=("book_flight", "book_hotel"),
         patch=FRAUD_CHECK_PATCH)))
"""v1 edited in place the safe way: the fraud check before the charge, behind a patch marker."""

STEP_AFTER_CHARGE = dataclasses.replace(TRIP, steps=(*TRIP.steps, Step(
    name="send_receipt", participant="notification", command="send_itinerary", depends_on=("charge_card",),
    retry=RetryPolicy(max_attempts=None))))
"""v1 edited in place: one more step after the pivot."""

PATIENT = dataclasses.replace(TRIP, steps=_edited(
    book_hotel=dataclasses.replace(TRIP.step("book_hotel"), retry=RetryPolicy(max_attempts=9))))
"""v1 edited in place, its policy only: the hotel is tried up to 9 times."""

NO_CHARGE = dataclasses.replace(TRIP, steps=_edited(charge_card=None, send_itinerary=dataclasses.replace(
    TRIP.step("send_itinerary"), depends_on=("book_flight", "book_hotel"))))
"""v1 edited in place: the charge removed."""

FLIGHT_ONLY: SagaDefinition = dataclasses.replace(TRIP, version=2, steps=_edited(
    book_hotel=None, charge_card=dataclasses.replace(TRIP.step("charge_card"), depends_on=("book_flight",))))
"""v2: a trip without a hotel, run by the same participants."""

RECEIPT_V2: SagaDefinition = dataclasses.replace(STEP_AFTER_CHARGE, version=2)
"""v2: a receipt sent after the charge, beside the itinerary (running v1 trips may move to it)."""

CHECK_BEFORE_CHARGE_V2: SagaDefinition = dataclasses.replace(CHECK_BEFORE_CHARGE, version=2)
"""v2: a fraud check before the charge (a v1 trip that already sent its charge cannot move to it)."""

WAIT_AFTER_CHARGE_V2: SagaDefinition = dataclasses.replace(
    TRIP, version=2, signals=(*TRIP.signals, ("receipt_seen", TRIP.input_schema)), steps=(*TRIP.steps, Step(
        name="await_receipt", participant="", command="", signal="receipt_seen", depends_on=("charge_card",),
        timeout_ms=300, on_expiry=Expiry.GO_ON, retry=RetryPolicy(max_attempts=None))))
"""v2: after the charge, a wait of up to 300 ms for a ``receipt_seen`` signal, going on without it (a step of its
own that no participant runs, so each step's effect still shows once)."""
