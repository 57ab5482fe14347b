"""The reference participants by name."""

from __future__ import annotations

from ..infra.references import load_reference
from .flight.participant import PARTICIPANT as FLIGHT
from .hotel.participant import PARTICIPANT as HOTEL
from .kit.participant import Participant
from .notification.participant import PARTICIPANT as NOTIFICATION
from .payment.participant import PARTICIPANT as PAYMENT

REFERENCE_PARTICIPANTS: dict[str, Participant] = {p.name: p for p in (FLIGHT, HOTEL, PAYMENT, NOTIFICATION)}


def get_participant(name: str) -> Participant:
    """A reference participant by name, or your own as ``module:attribute``; ValueError says what is wrong."""
    if ":" in name:
        try:
            found = load_reference(name)
        except ValueError as error:
            raise ValueError(f"cannot load participant {name!r}: {error}") from None
        if not isinstance(found, Participant):
            raise ValueError(f"{name} is not a participants.kit Participant")
        return found
    try:
        return REFERENCE_PARTICIPANTS[name]
    except KeyError:
        known = ", ".join(sorted(REFERENCE_PARTICIPANTS))
        raise ValueError(f"unknown participant {name!r} (known: {known}, or module:attribute)") from None
