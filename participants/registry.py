"""Participants by reference: ``module:attribute`` of a kit Participant (or a ``participant(...)`` declaration),
or the short name of one of the trip example's (``flight`` is the trip app's participant ``flight``)."""

from __future__ import annotations

from ..infra.app import App
from ..infra.deployment import Deployment, load_deployment
from ..infra.misconfigured import Misconfigured
from ..infra.references import load_reference
from ..infra.settings import Settings
from .kit.participant import Participant
from .kit.typed import ParticipantSpec

TRIP_APP = "saga_orchestrator.participants.trip:app"
REFERENCE_PARTICIPANTS = ("flight", "hotel", "payment", "notification")
"""The trip example's participants by short name (those of the app TRIP_APP names)."""


def get_participant(name: str, deployment: Deployment | None = None) -> Participant:
    """A participant by the name ``deployment``'s app gives it (``infra.deployment``), by reference
    (``module:attribute``) or by the short name of a trip participant; ValueError says what is wrong."""
    loaded = deployment.app if deployment is not None else None
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
    """The participant workers of the deployment (``infra.deployment``): each one's participant names or paths
    (SAGA_PARTICIPANTS; with an app and no SAGA_PARTICIPANTS, a worker for each of the app's participants)."""
    return load_deployment(current, saga_types=False).workers


def configured_participants(current: Settings) -> list[str]:
    """Every participant of the deployment's workers (names or paths), whichever worker hosts it."""
    return load_deployment(current, saga_types=False).participant_names()


def deployment_participants(settings: Settings) -> list[Participant]:
    """Every participant of the deployment (what ``saga effects`` and ``saga verify`` read the effects of);
    Misconfigured names the setting when one cannot be loaded."""
    deployment = load_deployment(settings, saga_types=False)
    try:
        return [get_participant(name, deployment) for name in dict.fromkeys(deployment.participant_names())]
    except ValueError as error:
        raise Misconfigured(f"SAGA_PARTICIPANTS={settings.saga_participants!r}: {error}") from None
