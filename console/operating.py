"""The console's one way to act: a lever, pulled for an operator, audited, and decided by the orchestrator.

The console never changes a saga itself. It publishes the control command on ``saga.control`` (as the CLI
does); the orchestrator's pure core decides it and records ``OperatorAction`` (or ``OperatorActionRefused``
with why) in the saga's own stream. The console shows a lever only where the core would apply it now: it asks
``decide`` with the saga's folded state, the same function the orchestrator runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..orchestrator.domain.decide import decide
from ..orchestrator.domain.definition import SagaDefinition
from ..orchestrator.domain.errors import DomainError, InvalidMessage
from ..orchestrator.domain.state import SagaState, SagaStatus
from ..schemas.event_types import OperatorActionRefused, SagaCancelRefused
from ..schemas.message_types import CancelSaga, Lever, OperateSaga, ReleaseSaga, ResumeCompensation

CANCEL = "Cancel"
RELEASE = "Release"
RESUME = "Resume"
ACTIONS: tuple[str, ...] = (*(lever.value for lever in Lever if lever is not Lever.DLQ_REPLAY), CANCEL, RELEASE,
                            RESUME)
"""Every action the console offers on one saga: the levers, and the older cancel, release and resume (a dead
letter's replay is offered where the dead letters are)."""
NEEDS_STEP = frozenset({Lever.RETRY_NOW.value, Lever.SKIP.value})
NEEDS_REASON = frozenset({Lever.SKIP.value, Lever.FORCE_COMPENSATE.value, Lever.TERMINATE.value, Lever.REDRIVE.value,
                          CANCEL})


class ControlPublisher(Protocol):
    """What the console needs of ``client.SagaClient``: publishing control commands."""

    async def operate(self, message: OperateSaga) -> None: ...

    async def cancel(self, saga_id: str, reason: str, operator: str | None = None) -> None: ...

    async def release(self, saga_id: str, operator: str | None = None, detail: str | None = None) -> None: ...

    async def resume(self, saga_id: str, operator: str | None = None, detail: str | None = None) -> None: ...


class ActionRefused(ValueError):
    """An action asked wrongly (unknown, no step where one is needed, no reason where one is needed)."""


@dataclass(frozen=True)
class Offer:
    """An action the core would apply to the saga now (``step``: for a step lever, which step)."""

    action: str
    step: str | None = None

    @property
    def needs_reason(self) -> bool:
        return self.action in NEEDS_REASON


def message_for(saga_id: str, action: str, step: str | None, operator: str,
                reason: str | None) -> OperateSaga | CancelSaga | ReleaseSaga | ResumeCompensation:
    """The control command for ``action``; ActionRefused when it is asked wrongly."""
    if action not in ACTIONS:
        raise ActionRefused(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
    if action in NEEDS_STEP and not step:
        raise ActionRefused(f"{action} needs the step it acts on")
    if action in NEEDS_REASON and not (reason or "").strip():
        raise ActionRefused(f"{action} needs a reason: it is recorded in the saga's history")
    if action == CANCEL:
        return CancelSaga(saga_id=saga_id, reason=reason or "", operator=operator)
    if action == RELEASE:
        return ReleaseSaga(saga_id=saga_id, operator=operator, detail=reason)
    if action == RESUME:
        return ResumeCompensation(saga_id=saga_id, operator=operator, detail=reason)
    return OperateSaga(saga_id=saga_id, action=action, step=step if action in NEEDS_STEP else None,
                       operator=operator, reason=reason)


async def publish(control: ControlPublisher, message: OperateSaga | CancelSaga | ReleaseSaga | ResumeCompensation
                  ) -> None:
    """Send ``message`` on saga.control."""
    if isinstance(message, OperateSaga):
        await control.operate(message)
    elif isinstance(message, CancelSaga):
        await control.cancel(message.saga_id, message.reason, message.operator)
    elif isinstance(message, ReleaseSaga):
        await control.release(message.saga_id, message.operator, message.detail)
    else:
        await control.resume(message.saga_id, message.operator, message.detail)


def offers(definition: SagaDefinition | None, state: SagaState | None, now_ms: int) -> list[Offer]:
    """The actions the orchestrator's core would apply to the saga now, each step lever per step it fits."""
    if state is None:
        return []
    if state.status is SagaStatus.QUARANTINED:
        return [Offer(RELEASE)]
    found: list[Offer] = []
    for action in ACTIONS:
        steps: Sequence[str | None] = list(state.steps) if action in NEEDS_STEP else [None]
        for step in steps:
            if _applies(definition, state, message_for(state.saga_id, action, step, "console", "check"), now_ms):
                found.append(Offer(action, step))
    return found


def _applies(definition: SagaDefinition | None, state: SagaState,
             message: OperateSaga | CancelSaga | ReleaseSaga | ResumeCompensation, now_ms: int) -> bool:
    try:
        decision = decide(definition, state, message, now_ms)
    except (DomainError, InvalidMessage):
        return False
    refused = (OperatorActionRefused, SagaCancelRefused)
    return bool(decision.events) and not any(isinstance(event, refused) for event in decision.events)
