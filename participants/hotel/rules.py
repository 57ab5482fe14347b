"""Business rules of the hotel participant (pure)."""

from __future__ import annotations

from participants.kit.outcome import Failed, Proceed, Verdict

SOLD_OUT_DESTINATION = "Atlantis"  # demo trigger: a definitive booking failure


def book_hotel_rule(destination: str) -> Verdict:
    """No rooms are left in some places."""
    if destination == SOLD_OUT_DESTINATION:
        return Failed("SoldOut", f"no rooms left in {destination}")
    return Proceed()
