"""Participants by reference: ``module:attribute`` of a kit Participant (or a ``participant(...)`` declaration),
or the short name of one of the trip example's (``flight`` is the trip app's participant ``flight``)."""

from __future__ import annotations

from ..infra.app import App, current_app, load_app
from ..infra.misconfigured import Misconfigured
from ..infra.references import load_reference
from ..infra.settings import Settings
from .kit.participant import Participant
from .kit.typed import ParticipantSpec

TRIP_APP = "saga_orchestrator.participants.trip:app"
REFERENCE_PARTICIPANTS = ("flight", "hotel", "payment", "notification")
"""The trip example's participants by short name (those of the app TRIP_APP names)."""


def get_participant(name: str) -> Participant:
    """A participant by the name the deployment's app gives it (``infra.app``), by reference
    (``module:attribute``) or by the short name of a trip participant; ValueError says what is wrong."""
    loaded = current_app()
    if loaded is not None and name in loaded.app.participant_names():
        found_in_app: Participant = loaded.app.participant(name)
        return found_in_app
    if name in REFERENCE_PARTICIPANTS:
        trip_app = load_reference(TRIP_APP)
        assert isinstance(trip_app, App)
        trip: Participant = trip_app.participant(name)
        return trip
    if ":" not in name:
        known = ", ".join(sorted(loaded.app.participant_names()) if loaded is not None else REFERENCE_PARTICIPANTS)
        raise ValueError(f"unknown participant {name!r} (known: {known}, or module:attribute)")
    try:
        found = load_reference(name)
    except ValueError as error:
        raise ValueError(f"cannot load participant {name!r}: {error}") from None
    if isinstance(found, ParticipantSpec):
        return found.build()
    if not isinstance(found, Participant):
        raise ValueError(f"{name} is not a participants.kit Participant")
    return found


def participant_workers(current: Settings) -> list[list[str]]:
    """The participant workers of ``SAGA_PARTICIPANTS``: each one's participant names or paths; with an app
    (``infra.app``) and no SAGA_PARTICIPANTS of its own, a worker for each of the app's participants."""
    loaded = load_app(current.saga_app)
    if loaded is not None and "saga_participants" not in current.model_fields_set:
        return [[name] for name in loaded.app.participant_names()]
    workers = [[path.strip() for path in entry.split("+") if path.strip()]
               for entry in current.saga_participants.split(",")]
    return [worker for worker in workers if worker]


def configured_participants(current: Settings) -> list[str]:
    """Every participant of ``SAGA_PARTICIPANTS`` (names or paths), whichever worker hosts it."""
    return [name for worker in participant_workers(current) for name in worker]


def deployment_participants(settings: Settings) -> list[Participant]:
    """Every participant of the deployment: its app's, else those SAGA_PARTICIPANTS names (what ``saga effects``
    and ``saga verify`` read the effects of); Misconfigured names the setting when one cannot be loaded."""
    loaded = load_app(settings.saga_app)
    if loaded is not None:
        return [loaded.app.participant(name) for name in loaded.app.participant_names()]
    try:
        return [get_participant(name) for name in dict.fromkeys(configured_participants(settings))]
    except ValueError as error:
        raise Misconfigured(f"SAGA_PARTICIPANTS={settings.saga_participants!r}: {error}") from None
