"""Trips driven to a given end through the pure core, for tests that need a recorded trip."""

from __future__ import annotations

from saga_orchestrator.testing.history import T0, SagaRun


def trip_run(kind: str, saga_id: str = "s1", at: int = T0) -> SagaRun:
    """A trip driven to an end, or not: ``completed``, ``compensated`` (the hotel sold out), ``running`` (the
    charge in flight) or ``rejected`` (a start of an unknown type, nothing started)."""
    from saga_orchestrator.participants.trip.definition import TRIP

    run = SagaRun(None if kind == "rejected" else TRIP, saga_id=saga_id, now=at)
    if kind == "rejected":
        run.start(saga_type="cruise")
        return run
    run.start()
    run.ok("book_flight")
    if kind == "compensated":
        run.fail("book_hotel", error="SoldOut")
        run.comp_ok("book_flight")
        return run
    run.ok("book_hotel")
    if kind == "completed":
        run.ok("charge_card")
        run.ok("send_itinerary")
    return run
