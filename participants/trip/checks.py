"""What ``saga verify`` checks of a trip's effects: which participant count shows each step's effect and its
undoing, read from the reference participants' tables. Registered when the trip package is loaded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...orchestrator.invariants import EffectCounts, EffectRules, StepEffect, register_rules
from .definition import TRIP
from .effects import collect_effects, effects_by_idempotency_key_counts


async def trip_effects(pool: Any, saga_id: str) -> EffectCounts:
    """Effect counts of one trip from the reference participants' tables."""
    return (await collect_effects(pool, saga_id)).counts()


async def trip_duplicates(pool: Any) -> Mapping[str, Mapping[str, int]]:
    """The business rows recorded more than once for one step of one saga, by table."""
    return await effects_by_idempotency_key_counts(pool, only_duplicates=True)


TRIP_RULES = EffectRules(
    steps={
        "book_flight": StepEffect("flight", "booked", "cancelled"),
        "book_hotel": StepEffect("hotel", "booked", "cancelled"),
        "charge_card": StepEffect("payment", "charged", "refunded"),
        "send_itinerary": StepEffect("notification", "sent"),
    },
    read_effects=trip_effects,
    read_duplicates=trip_duplicates,
)

register_rules(TRIP.saga_type, TRIP_RULES)
