"""The saga state model: what a saga's history says, as frozen dataclasses (built by ``evolve``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from ...schemas.message_types import Lever
from .status import SagaStatus, StepStatus

_Model = TypeVar("_Model", "StepState", "SagaState")

RESUME_COMPENSATION = "ResumeCompensation"
"""OperatorAction.action of an operator resuming a COMPENSATION_FAILED saga."""

RELEASE = "ReleaseSaga"
"""OperatorActionRefused.action of a ReleaseSaga of a saga that is not quarantined (an applied one is
SagaReleased)."""

RECORDED_ONLY: frozenset[str] = frozenset({Lever.DLQ_REPLAY})
"""Levers that change nothing and are recorded (OperatorAction) whatever the saga's status, quarantined, rejected
or purged too: an operator's act that happened elsewhere, kept in the saga's history."""

ANSWER = "Answer"
"""OperatorAction.action of a person's answer to a deferred command (a StepResult with an ``operator``, as
``saga answer`` sends it), recorded just before the outcome it gave; its detail is the step and why."""


@dataclass(frozen=True, kw_only=True)
class StepState:
    """What the history says about one step."""

    name: str
    idempotency_key: str
    compensation_key: str
    status: StepStatus = StepStatus.PENDING
    attempt: int = 0  # latest forward attempt sent or scheduled
    compensation_attempt: int = 0  # latest compensation attempt sent or scheduled
    outcome_unknown: bool = False  # latest attempt timed out: it may still have taken effect
    last_error_type: str | None = None
    last_error_message: str | None = None
    output: bytes | None = None
    waived: bool = False  # SKIPPED by an operator after it was sent: counts as done for its dependents
    attempt_base: int = 0  # attempts spent before the latest Redrive: the retry policy counts the ones after it
    unspent: int = 0  # attempts answered Expired (no worker picked them up in time): the retry policy skips them
    withdrawals: int = 0  # WithdrawStep sent for its latest attempt (the first, and each one sent again)
    landed_late: bool = False  # took effect after the saga turned back and has no undo: a human must act
    waiting_until: int | None = None  # a step waiting for a signal: when its wait ends without it (epoch ms)

    @property
    def spent(self) -> int:
        """The attempts the retry policy counts: those since the latest Redrive that a worker started on."""
        return self.attempt - self.attempt_base - self.unspent


@dataclass(frozen=True, kw_only=True)
class SagaState:
    """What the history says about one saga."""

    saga_id: str
    saga_type: str
    definition_version: int  # 0 for a saga that was rejected before it started
    tenant_id: str | None
    input: bytes
    status: SagaStatus
    steps: Mapping[str, StepState]
    last_seq: int
    started_at: int
    updated_at: int
    pivot_passed: bool = False
    cancel_requested: bool = False
    cancel_reason: str | None = None
    failure_reason: str | None = None  # why the saga unwound or failed
    failed_step: str | None = None  # the forward step whose failure ended or unwound the saga
    compensation_failed_step: str | None = None
    compensation_failure_reason: str | None = None
    traceparent: str | None = None  # from SagaStarted: the trace context every message of the saga carries
    quarantined_from: SagaStatus | None = None  # while QUARANTINED: the status a release puts it back to
    quarantine_reason: str | None = None
    paused: bool = False  # an operator's Pause: nothing is sent and no timer acts until Unpause
    forced_compensation: bool = False  # an operator's ForceCompensate: undoing past the pivot was asked for
    signals: Mapping[str, tuple[str, bytes]] = field(default_factory=dict)  # taken: name -> (signal id, payload)
    signal_ids: frozenset[str] = frozenset()  # every signal id seen, taken or refused: a second one changes nothing

    @property
    def is_terminal(self) -> bool:
        """True when the saga reached a terminal status."""
        return self.status.is_terminal

    @property
    def reason(self) -> str | None:
        """The most relevant human-readable reason for the saga's current status."""
        if self.status is SagaStatus.QUARANTINED:
            return self.quarantine_reason
        if self.status is SagaStatus.COMPENSATION_FAILED:
            return self.compensation_failure_reason
        if self.status is SagaStatus.CANCELLED:
            return self.cancel_reason
        return self.failure_reason

    def step(self, name: str) -> StepState:
        """The state of step ``name``."""
        return self.steps[name]


_FIELDS = {cls: frozenset(f.name for f in fields(cls)) for cls in (StepState, SagaState)}


def evolved(model: _Model, **changes: Any) -> _Model:
    """``dataclasses.replace`` for the two state models, without re-running ``__init__``.

    The fold replaces a state a few times per event, and ``replace`` (field introspection plus a frozen
    ``__init__`` that sets every field through ``object.__setattr__``) was the orchestrator's largest single
    cost. The models have no ``__post_init__`` or derived fields, so copying the attribute dict is the
    same thing. Unknown field names are refused, as ``replace`` refuses them.
    """
    unknown = changes.keys() - _FIELDS[type(model)]
    if unknown:
        raise TypeError(f"{type(model).__name__} has no field(s) {sorted(unknown)}")
    copy = object.__new__(type(model))
    attributes = vars(copy)
    attributes.update(vars(model))
    attributes.update(changes)
    return copy
