"""The trip saga, whole: the example a saga type of your own is written like.

``records`` (its input and each step's output, pydantic models; their Avro schemas in ``inputs/`` and
``outputs/``); the four participants ``flight``, ``hotel``, ``payment`` and ``notification``, each declared with
typed actions beside its business rules; ``definition`` (the saga ``trip``: book a flight ∥ book a hotel →
charge the card, the pivot → send the itinerary, built from those actions, and ``app``, the deployment);
``scenarios`` (trips that reach every trigger, with what each must end as: the demo and the tests);
``effects`` (what the participants did, read back from their tables with the kit's reader: each participant
declares where its effects show, which is all ``saga effects`` and ``saga verify`` need).

It is loaded the way a user's saga is, by ``SAGA_APP=saga_orchestrator.participants.trip:app``; or, as a 0.1
deployment is, by ``SAGA_DEFINITIONS=saga_orchestrator.participants.trip:TRIP``, ``SAGA_SCHEMA_PATH`` (this
package, for its records: the default) and ``SAGA_PARTICIPANTS=flight,hotel,payment,notification`` (the short
names are the app's participants). No setting names it by default: ``make demo`` and the tests name it.
"""

from __future__ import annotations

from .definition import TRIP, TRIP_REQUEST, app

PARTICIPANTS: tuple[str, ...] = ("flight", "hotel", "payment", "notification")
"""The trip's participants, by name (their topics: ``<name>.commands`` and ``<name>.results``)."""

__all__ = ["PARTICIPANTS", "TRIP", "TRIP_REQUEST", "app"]
