"""Business rules of the flight participant (pure)."""

from __future__ import annotations

from ..kit.outcome import Failed, Proceed, Verdict

UNCANCELLABLE_CUSTOMER = "cust_uncancellable"  # demo trigger: a compensation that fails for good


def book_flight_rule(origin: str, destination: str) -> Verdict:
    """A flight needs two different airports."""
    if origin == destination:
        return Failed("InvalidRoute", f"origin and destination are both {origin!r}")
    return Proceed()


def cancel_flight_rule(customer_id: str) -> Verdict:
    """Some fares cannot be cancelled."""
    if customer_id == UNCANCELLABLE_CUSTOMER:
        return Failed("CancellationRefused", f"the fare of {customer_id} cannot be cancelled")
    return Proceed()
