"""A 0.1 saga package that registered hand-written effect rules for ``saga verify`` (0.2 reads each
participant's declared effects instead)."""

from saga_orchestrator.orchestrator.invariants import EffectRules, register_rules
from saga_orchestrator.participants.trip.definition import TRIP

register_rules(TRIP.saga_type, EffectRules(steps={}))
DEFINITION = TRIP
