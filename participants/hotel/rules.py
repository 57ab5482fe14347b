"""Business rules of the hotel participant (pure)."""

from __future__ import annotations

from ..kit.outcome import Failed, Proceed, Verdict

SOLD_OUT_DESTINATION = "Atlantis"  # demo trigger: a definitive booking failure
SLOW_DESTINATION = "Slowtown"  # demo trigger: the booking reply comes late (a window to cancel in)
SLOW_REPLY_MS = 1_200  # below the book_hotel step timeout, so it is late but not timed out


def book_hotel_rule(destination: str) -> Verdict:
    """No rooms are left in some places."""
    if destination == SOLD_OUT_DESTINATION:
        return Failed("SoldOut", f"no rooms left in {destination}")
    if destination == SLOW_DESTINATION:
        return Proceed(reply_delay_ms=SLOW_REPLY_MS)
    return Proceed()
