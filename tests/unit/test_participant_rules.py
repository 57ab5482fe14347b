"""Business rules of the reference participants: the demo triggers and their attempt thresholds."""

from __future__ import annotations

import pytest

from saga_orchestrator.participants.kit.outcome import Failed, Proceed
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.participants.trip.flight import book_flight_rule, cancel_flight_rule
from saga_orchestrator.participants.trip.hotel import SLOW_REPLY_MS as SLOW_HOTEL_REPLY_MS
from saga_orchestrator.participants.trip.hotel import book_hotel_rule
from saga_orchestrator.participants.trip.notification import send_itinerary_rule
from saga_orchestrator.participants.trip.payment import SLOW_REPLY_DELAY_MS, charge_card_rule


def test_flight_route_needs_two_airports() -> None:
    assert book_flight_rule("LHR", "JFK") == Proceed()
    verdict = book_flight_rule("LHR", "LHR")
    assert isinstance(verdict, Failed)
    assert (verdict.error_type, verdict.retryable) == ("InvalidRoute", False)


def test_flight_cancellation_refused_for_the_uncancellable_customer() -> None:
    assert cancel_flight_rule("cust_1") == Proceed()
    verdict = cancel_flight_rule("cust_uncancellable")
    assert isinstance(verdict, Failed)
    assert (verdict.error_type, verdict.retryable) == ("CancellationRefused", False)


def test_hotel_sold_out_in_atlantis() -> None:
    assert book_hotel_rule("Lisbon") == Proceed()
    verdict = book_hotel_rule("Atlantis")
    assert isinstance(verdict, Failed)
    assert (verdict.error_type, verdict.retryable) == ("SoldOut", False)


def test_hotel_in_slowtown_books_but_replies_late() -> None:
    assert book_hotel_rule("Slowtown") == Proceed(reply_delay_ms=SLOW_HOTEL_REPLY_MS)
    assert 0 < SLOW_HOTEL_REPLY_MS < TRIP.step("book_hotel").timeout_ms


@pytest.mark.parametrize("attempt", [1, 2, 5])
def test_declined_card_fails_for_good_on_every_attempt(attempt: int) -> None:
    verdict = charge_card_rule("tok_declined", attempt)
    assert isinstance(verdict, Failed)
    assert (verdict.error_type, verdict.retryable) == ("CardDeclined", False)


@pytest.mark.parametrize(("attempt", "fails"), [(1, True), (2, True), (3, False), (4, False)])
def test_flaky_card_times_out_on_the_first_two_attempts(attempt: int, fails: bool) -> None:
    verdict = charge_card_rule("tok_flaky", attempt)
    if fails:
        assert isinstance(verdict, Failed)
        assert (verdict.error_type, verdict.retryable) == ("CardNetworkTimeout", True)
    else:
        assert verdict == Proceed()


def test_slow_card_charges_but_delays_only_the_first_reply() -> None:
    assert charge_card_rule("tok_slow", 1) == Proceed(reply_delay_ms=SLOW_REPLY_DELAY_MS)
    assert SLOW_REPLY_DELAY_MS > 2000  # longer than the payment step timeout, so a retry happens
    assert charge_card_rule("tok_slow", 2) == Proceed()


def test_ordinary_card_charges_at_once() -> None:
    assert charge_card_rule("tok_visa", 1) == Proceed()


@pytest.mark.parametrize(("attempt", "fails"), [(1, True), (3, True), (4, False)])
def test_bounce_mailbox_recovers_after_three_attempts(attempt: int, fails: bool) -> None:
    verdict = send_itinerary_rule("ann@bounce.test", attempt)
    if fails:
        assert isinstance(verdict, Failed)
        assert (verdict.error_type, verdict.retryable) == ("MailboxUnavailable", True)
    else:
        assert verdict == Proceed()


def test_ordinary_mailbox_is_sent_at_once() -> None:
    assert send_itinerary_rule("ann@example.com", 1) == Proceed()
    assert send_itinerary_rule("bounce.test@example.com", 1) == Proceed()  # only the domain triggers
