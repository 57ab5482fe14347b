"""Trip sagas that reach every documented trigger, with the outcome each must have (demo and tests)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...schemas import wire
from ...schemas.message_types import StartSaga
from ..kit.effects import SagaEffects
from .definition import TRIP_REQUEST

EFFECT_NAMES = ("flights_booked", "flights_cancelled", "hotels_booked", "hotels_cancelled", "charged",
                "refunded", "sent")


def effects(flight: tuple[int, int] = (0, 0), hotel: tuple[int, int] = (0, 0), charged: int = 0,
            refunded: int = 0, sent: int = 0) -> dict[str, int]:
    """Expected effect counts; a pair is (booked, cancelled)."""
    return {"flights_booked": flight[0], "flights_cancelled": flight[1], "hotels_booked": hotel[0],
            "hotels_cancelled": hotel[1], "charged": charged, "refunded": refunded, "sent": sent}


COMPLETED_EFFECTS = effects(flight=(1, 0), hotel=(1, 0), charged=1, sent=1)


@dataclass(frozen=True)
class Scenario:
    """One kind of trip and what it must end as."""

    name: str
    terminal: str
    expected: dict[str, int]
    changes: dict[str, Any] = field(default_factory=dict)
    cancel: bool = False  # send CancelSaga as soon as the saga has started
    # Other endings as good as (terminal, expected): a step in flight when the saga turns back is withdrawn,
    # and whether its participant ran it first is a race (a withdrawn step has no effect and needs no undo).
    withdrawn: tuple[tuple[str, dict[str, int]], ...] = ()

    def outcomes(self, cancel_refused: bool = False) -> list[tuple[str, dict[str, int]]]:
        """Every (terminal event, effect counts) a saga of this scenario may end with. A cancel reaches the
        orchestrator only as fast as Kafka carries it: held up (by a broker outage, say) until the pivot is
        in flight, it is refused (``SagaCancelRefused``), and the trip then goes ahead as if never sent."""
        if self.cancel and cancel_refused:
            return [("SagaCompleted", COMPLETED_EFFECTS)]
        return [(self.terminal, self.expected), *self.withdrawn]

    def may_end_as(self, cancel_refused: bool = False) -> set[str]:
        """The terminal events a saga of this scenario may end with."""
        return {terminal for terminal, _ in self.outcomes(cancel_refused)}

    def problems(self, terminal: str | None, found: dict[str, int], cancel_refused: bool = False) -> list[str]:
        """How one saga's ending differs from every ending its scenario allows; empty when one matches.
        The differences named are those from the scenario's first ending."""
        for allowed, expected in self.outcomes(cancel_refused):
            if terminal == allowed and not mismatches(expected, found):
                return []
        first, expected = self.outcomes(cancel_refused)[0]
        ended = [] if terminal in self.may_end_as(cancel_refused) else [f"ended {terminal}, expected {first}"]
        return ended + mismatches(expected, found)

    def trip(self, saga_id: str) -> dict[str, Any]:
        """The TripRequest for one saga of this scenario."""
        base: dict[str, Any] = {
            "customer_id": f"cust_{saga_id}", "origin": "LIS", "destination": "NYC",
            "depart_date": "2027-03-01", "return_date": "2027-03-09", "currency": "EUR",
            "card_token": "tok_ok", "email": f"{saga_id}@example.test", "amount_cents": 123_45,
        }
        return {**base, **self.changes}

    def start(self, saga_id: str) -> StartSaga:
        """The StartSaga command for one saga of this scenario."""
        encoded = wire.encode_input(TRIP_REQUEST, self.trip(saga_id))
        return StartSaga(saga_id=saga_id, saga_type="trip", tenant_id=None, input=encoded)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("happy", "SagaCompleted", COMPLETED_EFFECTS),
    Scenario("invalid_route", "SagaCompensated", effects(hotel=(1, 1)), {"destination": "LIS"},
             withdrawn=(("SagaCompensated", effects()),)),
    Scenario("atlantis", "SagaCompensated", effects(flight=(1, 1)), {"destination": "Atlantis"},
             withdrawn=(("SagaCompensated", effects()),)),
    Scenario("card_declined", "SagaCompensated", effects(flight=(1, 1), hotel=(1, 1)),
             {"card_token": "tok_declined"}),
    Scenario("card_flaky", "SagaCompleted", COMPLETED_EFFECTS, {"card_token": "tok_flaky"}),
    Scenario("card_slow", "SagaCompleted", COMPLETED_EFFECTS, {"card_token": "tok_slow"}),
    Scenario("email_bounce", "SagaCompleted", COMPLETED_EFFECTS, {"email": "traveller@bounce.test"}),
    Scenario("uncancellable", "SagaCompensationFailed", effects(flight=(1, 0)),
             {"customer_id": "cust_uncancellable", "destination": "Atlantis"},
             withdrawn=(("SagaCompensated", effects()),)),
    Scenario("cancelled", "SagaCancelled", effects(flight=(1, 1), hotel=(1, 1)),
             {"destination": "Slowtown"}, cancel=True,
             withdrawn=(("SagaCancelled", effects(flight=(1, 1))), ("SagaCancelled", effects(hotel=(1, 1))),
                        ("SagaCancelled", effects()))),
)}

# 20 sagas: every trigger at least once, the happy path several times.
DEMO_MIX: tuple[tuple[str, int], ...] = (
    ("happy", 5), ("invalid_route", 2), ("atlantis", 2), ("card_declined", 2), ("card_flaky", 2),
    ("card_slow", 2), ("email_bounce", 2), ("uncancellable", 2), ("cancelled", 1),
)


def observed(found: SagaEffects) -> dict[str, int]:
    """The effect counts of one saga, in the same shape as ``Scenario.expected``."""
    return {name: int(getattr(found, name)) for name in EFFECT_NAMES}


def mismatches(expected: dict[str, int], actual: dict[str, int]) -> list[str]:
    """Human-readable differences between expected and actual effect counts."""
    return [f"{name}: expected {expected[name]}, got {actual.get(name)}" for name in EFFECT_NAMES
            if expected[name] != actual.get(name)]
