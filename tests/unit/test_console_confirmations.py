"""What a destructive lever asks before it is pulled: on one saga, what it will and will not undo and which
commands are in flight; for a bulk job, the same said of each saga it takes; no question for the other levers."""

from __future__ import annotations

from saga_orchestrator.console import operating
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas.message_types import Lever
from saga_orchestrator.testing.history import SagaRun


def _charging() -> SagaRun:
    """A trip whose flight and hotel are booked and whose card is being charged."""
    run = SagaRun(TRIP, saga_id="confirm-1")
    run.start()
    run.ok("book_flight")
    run.ok("book_hotel")
    return run


def test_force_compensate_says_what_is_undone_and_what_is_in_flight() -> None:
    run = _charging()
    said = operating.confirmation(TRIP, run.saga, Lever.FORCE_COMPENSATE)
    assert said is not None
    assert "Undone: book_flight, book_hotel." in said and "Not undone (no undo): none." in said
    assert "Still in flight (withdrawn; undone if it took effect and has an undo): charge_card." in said


def test_terminate_says_nothing_is_undone_and_what_stays() -> None:
    said = operating.confirmation(TRIP, _charging().saga, Lever.TERMINATE)
    assert said is not None and "nothing is undone" in said
    assert "Took effect and stays: book_flight, book_hotel." in said and "charge_card" in said


def test_a_bulk_job_of_a_destructive_lever_asks_and_says_what_each_saga_keeps() -> None:
    assert "nothing is undone" in (operating.bulk_confirmation(Lever.TERMINATE) or "")
    turned_back = operating.bulk_confirmation(Lever.FORCE_COMPENSATE) or ""
    assert "is undone" in turned_back and "without an undo stays done" in turned_back and "withdrawn" in turned_back


def test_the_other_levers_ask_nothing() -> None:
    for lever in (Lever.RETRY_NOW, Lever.PAUSE, Lever.REDRIVE, Lever.MIGRATE):
        assert operating.bulk_confirmation(lever) is None
        assert operating.confirmation(TRIP, _charging().saga, lever) is None
