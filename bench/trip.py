"""The deployment the benchmarks measure: the example trip, named as a 0.1 deployment names it (no setting
defaults to it since 0.2)."""

from __future__ import annotations

from saga_orchestrator.infra.settings import Settings

TRIP_DEFINITIONS = "saga_orchestrator.participants.trip:TRIP"
TRIP_PARTICIPANTS = "flight,hotel,payment,notification"


def trip_settings(settings: Settings | None = None) -> Settings:
    """``settings`` (else the environment's) running the trip: its definition, and its four workers unless
    SAGA_PARTICIPANTS groups them otherwise."""
    base = settings or Settings()
    return base.model_copy(update={"saga_app": None, "saga_definitions": TRIP_DEFINITIONS,
                                   "saga_participants": base.saga_participants or TRIP_PARTICIPANTS})
