"""The console's one way to act: a lever, pulled for an operator, audited, and decided by the orchestrator.

The console never changes a saga itself. It publishes the control command on ``saga.control`` (as the CLI
does); the orchestrator's pure core decides it and records ``OperatorAction`` (or ``OperatorActionRefused``
with why) in the saga's own stream. The console shows a lever only where the core would apply it now: it asks
``decide`` with the saga's folded state, the same function the orchestrator runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..orchestrator.domain.builder import in_flight
from ..orchestrator.domain.decide import decide
from ..orchestrator.domain.definition import SagaDefinition
from ..orchestrator.domain.errors import DomainError, InvalidMessage
from ..orchestrator.domain.state import SagaState, SagaStatus, StepStatus
from ..schemas.event_types import OperatorActionRefused, SagaCancelRefused
from ..schemas.message_types import (
    CANCEL,
    NEEDS_REASON,
    RELEASE,
    SAGA_ACTIONS,
    STEP_LEVERS,
    ControlCommand,
    Lever,
    LeverRefused,
    lever_command,
)

ACTIONS = SAGA_ACTIONS
"""Every action the console offers on one saga (a dead letter's replay is offered where the dead letters are)."""


class ControlPublisher(Protocol):
    """What the console needs of ``client.SagaClient``: publishing signals (a lever goes through the
    orchestrator's outbox with its audit row: ``Console.act``)."""

    async def signal(self, saga_id: str, signal: str, payload: Mapping[str, Any], *, signal_id: str | None = None,
                     sender: str | None = None) -> str: ...


DESTRUCTIVE = frozenset({Lever.FORCE_COMPENSATE, Lever.TERMINATE, CANCEL})
"""The levers a page asks to confirm, saying what they will and will not undo."""

ActionRefused = LeverRefused
"""An action asked wrongly (``schemas.message_types.LeverRefused``)."""


@dataclass(frozen=True)
class Offer:
    """An action the core would apply to the saga now (``step``: for a step lever, which step)."""

    action: str
    step: str | None = None

    @property
    def needs_reason(self) -> bool:
        return self.action in NEEDS_REASON


def message_for(saga_id: str, action: str, step: str | None, operator: str, reason: str | None) -> ControlCommand:
    """The control command for ``action``; LeverRefused when it is asked wrongly (``lever_command``)."""
    return lever_command(action, saga_id, step, operator, reason, offered=ACTIONS)


def offers(definition: SagaDefinition | None, state: SagaState | None, now_ms: int) -> list[Offer]:
    """The actions the orchestrator's core would apply to the saga now, each step lever per step it fits."""
    if state is None:
        return []
    if state.status is SagaStatus.QUARANTINED:
        return [Offer(RELEASE)]
    found: list[Offer] = []
    for action in ACTIONS:
        steps: Sequence[str | None] = list(state.steps) if action in STEP_LEVERS else [None]
        for step in steps:
            if _applies(definition, state, message_for(state.saga_id, action, step, "console", "check"), now_ms):
                found.append(Offer(action, step))
    return found


def _applies(definition: SagaDefinition | None, state: SagaState,
             message: ControlCommand, now_ms: int) -> bool:
    try:
        decision = decide(definition, state, message, now_ms)
    except (DomainError, InvalidMessage):
        return False
    refused = (OperatorActionRefused, SagaCancelRefused)
    return bool(decision.events) and not any(isinstance(event, refused) for event in decision.events)


def confirmation(definition: SagaDefinition | None, state: SagaState | None, action: str) -> str | None:
    """What a destructive lever will and will not undo, and which commands are still in flight, for the operator
    to confirm; None for any other lever."""
    if action not in DESTRUCTIVE or state is None:
        return None
    took_effect = [name for name, step in state.steps.items() if step.status is StepStatus.SUCCEEDED
                   or (step.status is StepStatus.FAILED and step.outcome_unknown)]
    flying = [name for name, step in state.steps.items() if in_flight(step)]
    with_undo = [name for name in took_effect if definition is not None and definition.step(name).compensation]
    without = [name for name in took_effect if name not in with_undo]

    def listed(names: list[str]) -> str:
        return ", ".join(names) or "none"

    if action == Lever.TERMINATE:
        lines = [f"{action} ends the saga as it stands: nothing is undone.",
                 f"Took effect and stays: {listed(took_effect)}.",
                 f"Still in flight (their replies will change nothing): {listed(flying)}."]
    else:
        lines = [f"{action} turns the saga back.", f"Undone: {listed(with_undo)}.",
                 f"Not undone (no undo): {listed(without)}.",
                 f"Still in flight (withdrawn; undone if it took effect and has an undo): {listed(flying)}."]
    return " ".join(lines) + " Go on?"


def bulk_confirmation(action: str) -> str | None:
    """What a bulk job of a destructive lever will and will not undo in each saga it takes, and what becomes of
    the commands in flight (said per saga by ``confirmation``), for the operator to confirm before the job starts;
    None for any other lever."""
    if action not in DESTRUCTIVE:
        return None
    if action == Lever.TERMINATE:
        return (f"{action} ends each saga as it stands: nothing is undone; every step that took effect stays. "
                "Commands still in flight: their replies will change nothing.")
    return (f"{action} turns each saga back: every step that took effect and has an undo is undone; a step "
            "without an undo stays done. Commands still in flight are withdrawn (undone if they took effect and "
            "have an undo).")
