"""Participants by reference: ``module:attribute`` of a kit Participant, or the short name of one of the trip
example's (``flight`` is ``saga_orchestrator.participants.trip.flight:PARTICIPANT``), loaded the same way."""

from __future__ import annotations

from ..infra.app import current_app
from ..infra.references import load_reference
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
