"""The trip saga, whole: the example a saga type of your own is written like.

``definition`` (TRIP: book a flight ∥ book a hotel → charge the card, the pivot → send the itinerary) and its
input record (``inputs/trip_request.avsc``); the four participants ``flight``, ``hotel``, ``payment`` and
``notification``, each a kit Participant with its business rules; ``scenarios`` (trips that reach every
trigger, with what each must end as: the demo and the tests); ``effects`` (what the participants did, read
back from their tables with the kit's reader: each participant declares where its effects show, which is all
``saga effects`` and ``saga verify`` need).

It is loaded the way a user's saga is: ``SAGA_DEFINITIONS`` names ``saga_orchestrator.participants.trip:TRIP``,
``SAGA_SCHEMA_PATH`` this package (for its input record), and the participants are named by reference
(``flight`` is short for ``saga_orchestrator.participants.trip.flight:PARTICIPANT``).
"""

from __future__ import annotations

from .definition import TRIP, TRIP_REQUEST

PARTICIPANTS: tuple[str, ...] = ("flight", "hotel", "payment", "notification")
"""The trip's participants, by name (their topics: ``<name>.commands`` and ``<name>.results``)."""

__all__ = ["PARTICIPANTS", "TRIP", "TRIP_REQUEST"]
