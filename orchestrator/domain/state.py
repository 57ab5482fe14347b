"""Saga state as a fold of its events.

``fold`` is pure and deterministic: the same definition and events give an equal state. The statuses, their
legal-transition tables and the state dataclasses live in ``model.py``, the per-event functions in
``evolve.py``; this module is the public face of both.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...schemas.event_types import Event
from .definition import SagaDefinition
from .errors import HistoryMismatch
from .evolve import apply_event
from .model import (
    RESUME_COMPENSATION,
    SAGA_TRANSITIONS,
    STEP_TRANSITIONS,
    TERMINAL_STATUSES,
    SagaState,
    SagaStatus,
    StepState,
    StepStatus,
    is_step_transition_valid,
    is_transition_valid,
)

__all__ = [
    "RESUME_COMPENSATION",
    "SAGA_TRANSITIONS",
    "STEP_TRANSITIONS",
    "TERMINAL_STATUSES",
    "SagaState",
    "SagaStatus",
    "StepState",
    "StepStatus",
    "apply_event",
    "fold",
    "is_step_transition_valid",
    "is_transition_valid",
]


def fold(definition: SagaDefinition | None, events: Iterable[Event]) -> SagaState:
    """Replay ``events`` (in seq order) into a SagaState.

    ``definition`` may be None only for a history that never started (SagaRejected only); find it with
    ``DefinitionRegistry.for_history`` (for a migrated saga, the version of its last SagaMigrated, which
    decides its whole history). An empty history raises HistoryMismatch: a saga without events has
    no state (pass None to ``decide``).
    """
    state: SagaState | None = None
    for event in events:
        state = apply_event(definition, state, event)
    if state is None:
        raise HistoryMismatch("cannot fold an empty history")
    if definition is not None and state.definition_version not in (0, definition.version):
        # A later version is taken at SagaStarted only for a history that migrates to it (SagaMigrated).
        raise HistoryMismatch(f"saga {state.saga_id!r} runs on {state.saga_type!r} v{state.definition_version}, "
                              f"folded with {definition.saga_type!r} v{definition.version}")
    return state
