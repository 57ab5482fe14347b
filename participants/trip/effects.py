"""What the trip's participants did for one saga, read with the kit's reader from what they declare (tests and
the demo compare it with each scenario's expected counts).

Counts are of business rows: ``booked`` / ``charged`` / ``sent`` count every row ever created (a cancelled
booking was booked first), ``cancelled`` / ``refunded`` the rows compensated since.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from ..kit.effects import SagaEffects, duplicate_effects, read_effects
from ..kit.participant import Participant
from .definition import app

TRIP_PARTICIPANTS: tuple[Participant, ...] = tuple(app.participant(name) for name in app.participant_names())


@dataclass(frozen=True)
class TripEffects(SagaEffects):
    """One trip's effects, with a name for each count."""

    @property
    def flights_booked(self) -> int:
        return self.count("flight", "booked")

    @property
    def flights_cancelled(self) -> int:
        return self.count("flight", "cancelled")

    @property
    def hotels_booked(self) -> int:
        return self.count("hotel", "booked")

    @property
    def hotels_cancelled(self) -> int:
        return self.count("hotel", "cancelled")

    @property
    def charged(self) -> int:
        return self.count("payment", "charged")

    @property
    def refunded(self) -> int:
        return self.count("payment", "refunded")

    @property
    def sent(self) -> int:
        return self.count("notification", "sent")


async def collect_effects(pool: asyncpg.Pool, saga_id: str) -> TripEffects:
    """Every trip participant's rows, handled commands and counts for ``saga_id``."""
    found = await read_effects(pool, TRIP_PARTICIPANTS, saga_id)
    return TripEffects(found.saga_id, found.participants)


async def effects_by_idempotency_key_counts(pool: asyncpg.Pool, *, only_duplicates: bool = False
                                            ) -> dict[str, dict[str, int]]:
    """Business rows per ``{saga_id}:{step}``, per trip table (``kit.effects.duplicate_effects``)."""
    return await duplicate_effects(pool, TRIP_PARTICIPANTS, only_duplicates=only_duplicates)
