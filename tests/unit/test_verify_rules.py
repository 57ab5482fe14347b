"""The invariants of ``saga verify``: effect rules per terminal state, the read model, unfinished sagas."""

from __future__ import annotations

import dataclasses

import pytest

from saga_orchestrator.orchestrator.domain.definition import SagaDefinition, Step
from saga_orchestrator.orchestrator.domain.state import SagaState, SagaStatus, StepStatus
from saga_orchestrator.orchestrator.invariants import (
    PendingTimer,
    StepEffect,
    effect_problems,
    step_effects,
    summary_problems,
    why_not_terminal,
)
from saga_orchestrator.orchestrator.outbound import summary_of
from saga_orchestrator.orchestrator.ports import SagaSummaryRow
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.participants.trip.effects import TRIP_PARTICIPANTS
from saga_orchestrator.testing.history import SagaRun

DECLARED = {p.name: p.effects.actions for p in TRIP_PARTICIPANTS if p.effects is not None}
TRIP_EFFECTS = step_effects(TRIP, DECLARED)


def counts(flight: tuple[int, int] = (0, 0), hotel: tuple[int, int] = (0, 0), charge: tuple[int, int] = (0, 0),
           sent: int = 0) -> dict[str, dict[str, int]]:
    return {"flight": {"booked": flight[0], "cancelled": flight[1]},
            "hotel": {"booked": hotel[0], "cancelled": hotel[1]},
            "payment": {"charged": charge[0], "refunded": charge[1]},
            "notification": {"sent": sent}}


def completed() -> SagaState:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")
    run.ok("book_hotel")
    run.ok("charge_card")
    run.ok("send_itinerary")
    assert run.saga.status is SagaStatus.COMPLETED
    return run.saga


def hotel_sold_out() -> SagaState:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")
    run.fail("book_hotel", "SoldOut")
    run.comp_ok("book_flight")
    assert run.saga.status is SagaStatus.COMPENSATED
    return run.saga


def card_declined() -> SagaState:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")
    run.ok("book_hotel")
    run.fail("charge_card", "CardDeclined")
    run.comp_ok("book_flight")
    run.comp_ok("book_hotel")
    assert run.saga.status is SagaStatus.COMPENSATED
    return run.saga


def cancelled() -> SagaState:
    run = SagaRun(TRIP)
    run.start()
    run.cancel()
    run.ok("book_flight")
    run.ok("book_hotel")
    run.comp_ok("book_flight")
    run.comp_ok("book_hotel")
    assert run.saga.status is SagaStatus.CANCELLED
    return run.saga


def uncancellable() -> SagaState:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")
    run.fail("book_hotel", "SoldOut")
    run.comp_fail("book_flight", "CancellationRefused")
    assert run.saga.status is SagaStatus.COMPENSATION_FAILED
    assert run.saga.compensation_failed_step == "book_flight"
    return run.saga


def both_bookings_declined() -> SagaState:
    run = SagaRun(TRIP)
    run.start()
    run.fail("book_flight", "InvalidRoute")
    run.fail("book_hotel", "SoldOut")
    assert run.saga.status is SagaStatus.COMPENSATED  # turned back, nothing to undo
    return run.saga


def _forced_with_the_itinerary_in_flight(answer: str) -> SagaState:
    """A trip past its pivot, its itinerary in flight, compensated by force: the itinerary's participant answers
    its withdrawal (``answer``: it had run, or it had not)."""
    run = SagaRun(TRIP)
    run.start()
    for step in ("book_flight", "book_hotel", "charge_card"):
        run.ok(step)
    run.operate("ForceCompensate", reason="the customer disputed the trip")
    if answer == "had run":
        run.ok("send_itinerary")
    else:
        run.fail("send_itinerary", "Withdrawn")
    for step in ("charge_card", "book_hotel", "book_flight"):
        run.comp_ok(step)
    return run.saga


def forced_itinerary_withdrawn() -> SagaState:
    state = _forced_with_the_itinerary_in_flight("had not run")
    assert state.status is SagaStatus.COMPENSATED
    return state


def forced_itinerary_landed() -> SagaState:
    state = _forced_with_the_itinerary_in_flight("had run")
    assert state.status is SagaStatus.FAILED and state.failed_step == "send_itinerary"  # a human must act
    return state


def forced_before_withdrawals() -> SagaState:
    """The same saga as decided before withdrawals existed: the itinerary still RUNNING when it ended."""
    state = forced_itinerary_withdrawn()
    steps = dict(state.steps)
    steps["send_itinerary"] = dataclasses.replace(steps["send_itinerary"], status=StepStatus.RUNNING)
    return dataclasses.replace(state, steps=steps)


CASES = [
    # (name, state, counts, steps named in the problems)
    ("completed", completed, counts((1, 0), (1, 0), (1, 0), 1), []),
    ("completed, charged twice", completed, counts((1, 0), (1, 0), (2, 0), 1), ["charge_card"]),
    ("completed, refunded", completed, counts((1, 0), (1, 0), (1, 1), 1), ["charge_card"]),
    ("completed, flight cancelled", completed, counts((1, 1), (1, 0), (1, 0), 1), ["book_flight"]),
    ("completed, no itinerary", completed, counts((1, 0), (1, 0), (1, 0), 0), ["send_itinerary"]),
    ("completed, two itineraries", completed, counts((1, 0), (1, 0), (1, 0), 2), ["send_itinerary"]),
    ("sold out, flight cancelled", hotel_sold_out, counts(flight=(1, 1)), []),
    ("sold out, flight kept", hotel_sold_out, counts(flight=(1, 0)), ["book_flight"]),
    ("sold out, a hotel booked", hotel_sold_out, counts((1, 1), (1, 0)), ["book_hotel"]),
    ("sold out, itinerary sent", hotel_sold_out, counts(flight=(1, 1), sent=1), ["send_itinerary"]),
    ("declined, all undone", card_declined, counts((1, 1), (1, 1)), []),
    ("declined, net charge", card_declined, counts((1, 1), (1, 1), (1, 0)), ["charge_card"]),
    ("declined, charged and refunded", card_declined, counts((1, 1), (1, 1), (1, 1)), []),
    ("declined, hotel kept", card_declined, counts((1, 1), (1, 0)), ["book_hotel"]),
    ("cancelled, all undone", cancelled, counts((1, 1), (1, 1)), []),
    ("cancelled, flight kept", cancelled, counts((1, 0), (1, 1)), ["book_flight"]),
    ("compensation failed, refused step holds", uncancellable, counts(flight=(1, 0)), []),
    ("compensation failed, refused step undone", uncancellable, counts(flight=(1, 1)), ["book_flight"]),
    ("compensation failed, other booking kept", uncancellable, counts((1, 0), (1, 0)), ["book_hotel"]),
    ("declined, nothing happened", both_bookings_declined, counts(), []),
    ("declined, outstanding booking", both_bookings_declined, counts(hotel=(1, 0)), ["book_hotel"]),
    # the fence: once the saga turned back, no forward command may take effect unrecorded
    ("forced, itinerary withdrawn", forced_itinerary_withdrawn, counts((1, 1), (1, 1), (1, 1), 0), []),
    ("forced, itinerary sent anyway", forced_itinerary_withdrawn, counts((1, 1), (1, 1), (1, 1), 1),
     ["send_itinerary"]),
    ("forced before withdrawals, itinerary sent", forced_before_withdrawals, counts((1, 1), (1, 1), (1, 1), 1),
     ["send_itinerary"]),
    ("forced, itinerary landed and recorded", forced_itinerary_landed, counts((1, 1), (1, 1), (1, 1), 1), []),
    ("forced, itinerary landed, recorded, not found", forced_itinerary_landed, counts((1, 1), (1, 1), (1, 1), 0),
     ["send_itinerary"]),
]


@pytest.mark.parametrize(("name", "make", "found", "culprits"), CASES, ids=[c[0] for c in CASES])
def test_effects_must_match_how_the_saga_ended(name: str, make: object, found: dict[str, dict[str, int]],
                                                culprits: list[str]) -> None:
    state = make()  # type: ignore[operator]
    problems = effect_problems(state, found, TRIP_EFFECTS)
    assert [p.split(" ", 1)[0] for p in problems] == culprits, problems
    for problem in problems:
        assert state.status.value in problem


def test_completed_with_failures_is_reported_as_it_is_except_a_double_effect() -> None:
    state = dataclasses.replace(completed(), status=SagaStatus.COMPLETED_WITH_FAILURES)
    assert effect_problems(state, counts((1, 1), (0, 0), (1, 0), 0), TRIP_EFFECTS) == []
    assert [p.split(" ")[0] for p in effect_problems(state, counts(flight=(2, 0)), TRIP_EFFECTS)] == ["book_flight"]


def test_failed_after_the_pivot_keeps_what_the_steps_did() -> None:
    state = dataclasses.replace(completed(), status=SagaStatus.FAILED, pivot_passed=True)
    assert effect_problems(state, counts((1, 0), (1, 0), (1, 0), 1), TRIP_EFFECTS) == []
    before_pivot = dataclasses.replace(state, pivot_passed=False)
    assert len(effect_problems(before_pivot, counts((1, 0), (1, 0), (1, 0), 1), TRIP_EFFECTS)) == 3


def test_where_each_step_shows_is_derived_from_the_participants_declarations() -> None:
    assert TRIP_EFFECTS == {
        "book_flight": StepEffect("flight", "booked", "cancelled"),
        "book_hotel": StepEffect("hotel", "booked", "cancelled"),
        "charge_card": StepEffect("payment", "charged", "refunded"),
        "send_itinerary": StepEffect("notification", "sent"),
    }


def test_a_saga_of_its_own_is_checked_by_its_participants_declarations_alone() -> None:
    checkout = SagaDefinition(saga_type="checkout", version=1, input_schema="shop.Order", steps=(
        Step(name="authorise", participant="billing", command="authorise", compensation="void"),
        Step(name="confirm", participant="mail", command="send", depends_on=("authorise",))))
    effects = step_effects(checkout, {"billing": {"authorise": "captured", "void": "voided"}})
    assert effects == {"authorise": StepEffect("billing", "captured", "voided")}  # mail declares nothing
    run = SagaRun(checkout)
    run.start()
    run.ok("authorise")
    run.ok("confirm")
    assert effect_problems(run.saga, {"billing": {"captured": 1, "voided": 0}}, effects) == []
    assert effect_problems(run.saga, {"billing": {"captured": 1, "voided": 1}}, effects) == [
        "authorise (billing: captured=1, voided=1): a COMPLETED saga must hold its effect exactly once here"]


def test_an_undo_without_a_declared_count_cannot_be_checked_as_undone() -> None:
    effects = step_effects(TRIP, {"payment": {"charge_card": "charged"}})
    assert effects == {"charge_card": StepEffect("payment", "charged", None)}


def _summary(state: SagaState, **changes: object) -> SagaSummaryRow:
    return dataclasses.replace(summary_of(state), **changes)  # type: ignore[arg-type]


def test_the_read_model_must_agree_with_the_fold() -> None:
    state = uncancellable()
    assert summary_problems(state, _summary(state)) == []
    assert summary_problems(state, None) == ["no saga_summary row"]
    stale = summary_problems(state, _summary(state, status="COMPENSATING", last_seq=state.last_seq - 1))
    assert stale == ["saga_summary.status is 'COMPENSATING', the events say 'COMPENSATION_FAILED'",
                     f"saga_summary.last_seq is {state.last_seq - 1}, the events say {state.last_seq}"]
    stuck = _summary(state)
    assert stuck.step_failures > 0, "the uncancellable saga's compensation failed"
    assert summary_problems(state, _summary(state, step_failures=0)) == [
        f"saga_summary.step_failures is 0, the events say {stuck.step_failures}"]


def test_an_unfinished_saga_says_where_it_waits() -> None:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")
    state = run.saga
    timer = PendingTimer("STEP_TIMEOUT", "book_hotel", 1, state.updated_at + 1500)
    why = why_not_terminal(state, "StepSucceeded", [timer], {"saga.outbox": 2, "hotel.outbox": 0},
                           now_ms=state.updated_at + 500)
    assert why == (f"last event StepSucceeded (seq {state.last_seq}, 0.5s ago); "
                   "timers: STEP_TIMEOUT book_hotel#1 due in 1.0s; outbox rows: saga.outbox 2; "
                   "waiting on: book_hotel RUNNING")
    assert "no pending timer; outbox rows: none" in why_not_terminal(state, "StepSucceeded", [], {}, 0)
