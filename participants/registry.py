"""Participants by reference: ``module:attribute`` of a kit Participant, or the short name of one of the trip
example's (``flight`` is ``saga_orchestrator.participants.trip.flight:PARTICIPANT``), loaded the same way."""

from __future__ import annotations

from ..infra.references import load_reference
from .kit.participant import Participant

REFERENCE_PARTICIPANTS: dict[str, str] = {
    name: f"saga_orchestrator.participants.trip.{name}:PARTICIPANT"
    for name in ("flight", "hotel", "payment", "notification")
}
"""The trip example's participants by short name."""


def get_participant(name: str) -> Participant:
    """A participant by reference (``module:attribute``) or short name; ValueError says what is wrong."""
    reference = name if ":" in name else REFERENCE_PARTICIPANTS.get(name)
    if reference is None:
        known = ", ".join(sorted(REFERENCE_PARTICIPANTS))
        raise ValueError(f"unknown participant {name!r} (known: {known}, or module:attribute)")
    try:
        found = load_reference(reference)
    except ValueError as error:
        raise ValueError(f"cannot load participant {name!r}: {error}") from None
    if not isinstance(found, Participant):
        raise ValueError(f"{name} is not a participants.kit Participant")
    return found
