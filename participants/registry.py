"""Participants by reference: ``module:attribute`` of a kit Participant, or the short name of one of the trip
example's (``flight`` is ``saga_orchestrator.participants.trip.flight:PARTICIPANT``), loaded the same way."""

from __future__ import annotations

import re

from ..infra.app import current_app, load_app
from ..infra.misconfigured import Misconfigured
from ..infra.references import load_reference
from ..infra.settings import Settings
from .kit.participant import Participant
from .kit.typed import ParticipantSpec

REFERENCE_PARTICIPANTS: dict[str, str] = {
    name: f"saga_orchestrator.participants.trip.{name}:PARTICIPANT"
    for name in ("flight", "hotel", "payment", "notification")
}
"""The trip example's participants by short name."""


def get_participant(name: str) -> Participant:
    """A participant by the name the deployment's app gives it (``infra.app``), by reference
    (``module:attribute``) or by the short name of a trip participant; ValueError says what is wrong."""
    loaded = current_app()
    if loaded is not None and name in loaded.app.participant_names():
        found_in_app: Participant = loaded.app.participant(name)
        return found_in_app
    reference = name if ":" in name else REFERENCE_PARTICIPANTS.get(name)
    if reference is None:
        known = ", ".join(sorted(loaded.app.participant_names()) if loaded is not None else REFERENCE_PARTICIPANTS)
        raise ValueError(f"unknown participant {name!r} (known: {known}, or module:attribute)")
    try:
        found = load_reference(reference)
    except ValueError as error:
        raise ValueError(f"cannot load participant {name!r}: {error}") from None
    if isinstance(found, ParticipantSpec):
        return found.build()
    if not isinstance(found, Participant):
        raise ValueError(f"{name} is not a participants.kit Participant")
    return found


def deployment_participants(settings: Settings) -> list[Participant]:
    """Every participant of the deployment: its app's, else those SAGA_PARTICIPANTS names (what ``saga effects``
    and ``saga verify`` read the effects of); Misconfigured names the setting when one cannot be loaded."""
    loaded = load_app(settings.saga_app)
    if loaded is not None:
        return [loaded.app.participant(name) for name in loaded.app.participant_names()]
    names = [name for name in re.split(r"[,+]", settings.saga_participants) if name.strip()]
    try:
        return [get_participant(name.strip()) for name in dict.fromkeys(names)]
    except ValueError as error:
        raise Misconfigured(f"SAGA_PARTICIPANTS={settings.saga_participants!r}: {error}") from None
