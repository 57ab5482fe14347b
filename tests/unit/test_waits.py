"""What ``saga status``, the API and the console say a step waits for: a signal, a person, a worker, a participant's
word on a withdrawal, each with since when, its key and until when."""

from __future__ import annotations

from saga_orchestrator.orchestrator.domain.builder import TimerKind
from saga_orchestrator.orchestrator.domain.waits import PersonWait, waits
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.testing.history import T0, SagaRun
from tests.unit.test_signal_transitions import _loan


def _said(run: SagaRun, persons: dict[str, PersonWait] | None = None) -> list[str]:
    assert run.definition is not None
    return [f"{w.step}: {w.describe()}" for w in waits(run.definition, run.saga, run.events, persons)]


def test_a_step_waiting_for_a_signal_says_which_since_when_until_when_and_how_to_send_it() -> None:
    run = SagaRun(_loan())
    run.start()
    run.ok("hold")
    assert _said(run) == ["approval: waiting for signal Approval since 1970-01-01 00:16:40 UTC, expires at "
                          "1970-01-01 01:16:40 UTC (saga signal s1 Approval --payload ...)"]


def test_steps_in_flight_a_worker_that_did_not_answer_and_a_withdrawal_each_say_so() -> None:
    run = SagaRun(TRIP)
    run.start()
    assert _said(run) == [
        "book_flight: waiting for flight's answer since 1970-01-01 00:16:40 UTC, key s1:book_flight, expires at "
        "1970-01-01 00:16:42 UTC",
        "book_hotel: waiting for hotel's answer since 1970-01-01 00:16:40 UTC, key s1:book_hotel, expires at "
        "1970-01-01 00:16:42 UTC"]
    run.fire(TimerKind.STEP_TIMEOUT, "book_flight")
    run.fail("book_hotel", "SoldOut")
    assert _said(run) == [
        "book_flight: waiting for flight to say whether the withdrawn command had run since 1970-01-01 00:16:42 "
        "UTC, key s1:book_flight, expires at 1970-01-01 00:16:44 UTC"]


def test_a_command_deferred_to_a_person_says_whose_answer_and_the_command_that_gives_it() -> None:
    run = SagaRun(TRIP)
    run.start()
    run.fire(TimerKind.STEP_TIMEOUT, "book_hotel")
    person = PersonWait("hotel", "s1:book_hotel", T0 + 500, T0 + 60_000)
    assert _said(run, {"book_hotel": person})[1] == (
        "book_hotel: waiting for a person's answer to hotel since 1970-01-01 00:16:40 UTC, key s1:book_hotel, "
        "expires at 1970-01-01 00:17:40 UTC (saga answer hotel s1:book_hotel ...)")
    assert _said(run)[1] == ("book_hotel: waiting for a worker of hotel (no answer within the step's timeout) "
                             "since 1970-01-01 00:16:40 UTC, key s1:book_hotel")
