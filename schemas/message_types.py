"""The messages of the contract other than events: what clients and participants send and receive.

Field names follow the Avro records in ``schemas/`` (commands/, messages/, dlq/), so the codec in ``wire``
maps them mechanically. Topics: ``saga.start`` (StartSaga), ``saga.control`` (CancelSaga, ResumeCompensation,
ReleaseSaga), ``<participant>.commands`` (StepCommand, WithdrawStep), ``<participant>.results`` (StepResult),
``saga.dlq`` (DeadLetter).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from .ids import dead_letter_message_id, position_id


class CommandKind(StrEnum):
    FORWARD = "FORWARD"
    COMPENSATE = "COMPENSATE"


class ResultStatus(StrEnum):
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


@dataclass(frozen=True, kw_only=True)
class StartSaga:
    """Start a saga (topic saga.start)."""

    saga_id: str
    saga_type: str
    tenant_id: str | None
    input: bytes
    traceparent: str | None = None  # the W3C trace context of its record (a header, not in the Avro body)
    # The definition version to start on; None: the latest of its type that takes starts (not draining).
    definition_version: int | None = None


@dataclass(frozen=True, kw_only=True)
class CancelSaga:
    """Cancel a saga (topic saga.control); ``operator``: who asked, recorded with the cancel."""

    saga_id: str
    reason: str
    operator: str | None = None


@dataclass(frozen=True, kw_only=True)
class ResumeCompensation:
    """An operator asks a COMPENSATION_FAILED saga to try its compensations again (topic saga.control)."""

    saga_id: str
    operator: str | None
    detail: str | None


@dataclass(frozen=True, kw_only=True)
class ReleaseSaga:
    """An operator releases a quarantined saga, its cause fixed (topic saga.control)."""

    saga_id: str
    operator: str | None
    detail: str | None


@dataclass(frozen=True, kw_only=True)
class SignalSaga:
    """Data brought into a running saga (topic saga.control), deduplicated by ``signal_id``: a step waiting for
    ``signal`` goes on with ``payload`` (the record its saga type declares for the signal) as its output. With
    ``start_saga_type`` and ``start_input`` it starts the saga first when there is none (signal-with-start)."""

    saga_id: str
    signal_id: str
    signal: str
    payload: bytes
    sender: str | None = None
    start_saga_type: str | None = None
    start_input: bytes | None = None
    tenant_id: str | None = None

    def start(self) -> StartSaga | None:
        """The StartSaga a signal-with-start carries (None: it starts nothing)."""
        if self.start_saga_type is None or self.start_input is None:
            return None
        return StartSaga(saga_id=self.saga_id, saga_type=self.start_saga_type, tenant_id=self.tenant_id,
                         input=self.start_input)


class Lever(StrEnum):
    """What an OperateSaga may pull (its ``action``)."""

    RETRY_NOW = "RetryNow"  # a step (or its compensation) waiting on its retry backoff is sent at once
    SKIP = "Skip"  # a skippable step that is stuck is recorded as skipped; the saga goes on without its output
    FORCE_COMPENSATE = "ForceCompensate"  # undo what the saga did, also past its pivot or after it ended FAILED
    TERMINATE = "Terminate"  # the saga ends TERMINATED as it stands, nothing compensated (settled by hand)
    PAUSE = "Pause"  # nothing more is sent and no timer acts (replies are still recorded) until Unpause
    UNPAUSE = "Unpause"  # a paused saga goes on, what is open sent again
    REDRIVE = "Redrive"  # a saga that ended FAILED runs again: its failed steps are sent with a fresh attempt budget
    MIGRATE = "Migrate"  # a running saga moves to another version of its definition (``definition_version``)
    DLQ_REPLAY = "DlqReplay"  # records only: a dead letter of the saga was published again (`saga dlq replay`)


@dataclass(frozen=True, kw_only=True)
class OperateSaga:
    """An operator pulls a lever (``action``, e.g. RetryNow) on one saga, for a ``step`` where the lever acts on
    one (topic saga.control); the orchestrator records it, or its refusal, in the saga's stream.
    ``definition_version``: the version a Migrate moves the saga to (None for every other lever)."""

    saga_id: str
    action: str
    step: str | None
    operator: str | None
    reason: str | None
    definition_version: int | None = None


CANCEL, RESUME, RELEASE = "Cancel", "Resume", "Release"
"""The operator's actions on one saga other than a lever: CancelSaga, ResumeCompensation and ReleaseSaga."""


@dataclass(frozen=True)
class ActionRule:
    """What one operator action needs, for every face that offers it (the command line, the client, the console
    and its API, bulk jobs, the test kit) and for the core that decides it: whether it names a step, and the
    reason it requires (what that reason must say; None: a reason is optional)."""

    action: str
    on_step: bool
    reason: str | None
    does: str

    def problem(self, step: str | None, reason: str | None) -> str | None:
        """Why the action cannot be asked this way (no step where it needs one, no reason where it needs one);
        None when it can."""
        if self.on_step and not step:
            return f"{self.action} needs the step it acts on"
        if self.reason is not None and not (reason or "").strip():
            return f"{self.action} needs a reason ({self.reason}): it is recorded in the saga's history"
        return None


ACTION_RULES: dict[str, ActionRule] = {rule.action: rule for rule in (
    ActionRule(Lever.RETRY_NOW.value, True, None,
               "a step or compensation waiting on its retry backoff is sent at once"),
    ActionRule(Lever.SKIP.value, True, "why the saga may go on without the step",
               "a stuck skippable step is recorded as skipped; the saga goes on without its output"),
    ActionRule(Lever.FORCE_COMPENSATE.value, False, "why what the saga did must be undone",
               "what the saga did is undone, also past its pivot or after it ended FAILED"),
    ActionRule(Lever.TERMINATE.value, False, "what settled the saga by hand",
               "the saga ends TERMINATED as it stands, nothing compensated"),
    ActionRule(Lever.PAUSE.value, False, None, "nothing more is sent and no timer acts until Unpause"),
    ActionRule(Lever.UNPAUSE.value, False, None, "a paused saga goes on, what is open sent again"),
    ActionRule(Lever.REDRIVE.value, False, "what was fixed so that its failed steps can succeed",
               "a FAILED saga runs again, its failed steps with a fresh attempt budget"),
    ActionRule(Lever.MIGRATE.value, False, None,
               "a running saga moves to another version of its definition, if what it did fits that version"),
    ActionRule(Lever.DLQ_REPLAY.value, False, "the letter it published again, and why",
               "records that a dead letter of the saga was published again"),
    ActionRule(CANCEL, False, "why the saga is cancelled", "the saga is cancelled: what it did is undone"),
    ActionRule(RESUME, False, None, "a COMPENSATION_FAILED saga retries its failed compensation"),
    ActionRule(RELEASE, False, None, "a QUARANTINED saga goes on where it stood"),
)}
"""Every operator action on one saga and what it needs: the one table the faces and the core read."""
STEP_LEVERS = frozenset(rule.action for rule in ACTION_RULES.values() if rule.on_step)
"""The levers that act on one step, which must be named."""
NEEDS_REASON = frozenset(rule.action for rule in ACTION_RULES.values() if rule.reason is not None)
"""The actions that require a reason."""
SAGA_ACTIONS: tuple[str, ...] = tuple(action for action in ACTION_RULES
                                      if action not in (Lever.DLQ_REPLAY, Lever.MIGRATE))
"""What an operator may pull on a saga (from the command line, a bulk job or the console): every lever but the
record of a dead letter's replay and Migrate (which names a version: ``saga definitions migrate``), and cancel,
resume and release."""
ControlCommand = CancelSaga | ResumeCompensation | ReleaseSaga | OperateSaga
"""A command on topic saga.control."""


def control_command(action: str, saga_id: str, step: str | None, operator: str | None,
                    reason: str | None, definition_version: int | None = None) -> ControlCommand:
    """The saga.control command of an operator's ``action`` (a ``Lever``, or CANCEL, RESUME or RELEASE) on one
    saga; ``reason`` is the cancel's reason, the detail of a resume or release, the reason of a lever, ``step``
    is kept for a step lever only, ``definition_version`` for a Migrate only."""
    if action == CANCEL:
        return CancelSaga(saga_id=saga_id, reason=reason or "", operator=operator)
    if action == RESUME:
        return ResumeCompensation(saga_id=saga_id, operator=operator, detail=reason)
    if action == RELEASE:
        return ReleaseSaga(saga_id=saga_id, operator=operator, detail=reason)
    return OperateSaga(saga_id=saga_id, action=action, step=step if action in STEP_LEVERS else None,
                       operator=operator, reason=reason,
                       definition_version=definition_version if action == Lever.MIGRATE else None)


def action_name(action: str, separator: str = "_") -> str:
    """``action``'s name on the faces: its method in Python (``ForceCompensate`` → ``force_compensate``), its
    command with ``separator`` "-" (``force-compensate``)."""
    return re.sub(r"(?<!^)(?=[A-Z])", separator, action).lower()


class LeverRefused(ValueError):
    """An operator action asked wrongly: unknown, no step where it needs one, no reason where it needs one (the
    words of ``ActionRule.problem``). Nothing was sent."""


def lever_command(action: str, saga_id: str, step: str | None, operator: str | None, reason: str | None, *,
                  offered: Iterable[str] = SAGA_ACTIONS) -> ControlCommand:
    """The saga.control command of an operator's ``action`` on one saga, checked against its row of
    ``ACTION_RULES`` (the one place that says whether it needs a step or a reason); LeverRefused when it is asked
    wrongly or is not among ``offered``. Every face builds its levers here."""
    offered = tuple(offered)
    if action not in offered:
        raise LeverRefused(f"unknown action {action!r}; one of {', '.join(offered)}")
    if (problem := ACTION_RULES[action].problem(step, reason)) is not None:
        raise LeverRefused(problem)
    return control_command(action, saga_id, step, operator, reason)


@dataclass(frozen=True, kw_only=True)
class StepCommand:
    """A command for a participant (topic <participant>.commands).

    ``participant`` and ``message_id`` travel outside the Avro body (topic name and header).
    """

    saga_id: str
    saga_type: str
    step: str
    participant: str
    action: str
    kind: CommandKind
    idempotency_key: str
    attempt: int
    input: bytes
    message_id: str
    step_outputs: tuple[tuple[str, bytes], ...] = ()  # (step, output) of its upstream steps, sorted
    expires_at: int | None = None  # forward: picked up after this (epoch ms), it is answered Expired, not run
    timeout_ms: int | None = None  # forward: how long its handler (or a deferred answer) may take once picked up


@dataclass(frozen=True, kw_only=True)
class WithdrawStep:
    """The step's forward command (``idempotency_key``, ``attempt``) must no longer run (topic
    <participant>.commands): the participant fences the key and answers whether the command had run.

    ``participant`` and ``message_id`` travel outside the Avro body (topic name and header).
    """

    saga_id: str
    saga_type: str
    step: str
    participant: str
    action: str
    idempotency_key: str
    attempt: int
    reason: str
    message_id: str


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """A participant's reply to a StepCommand (topic <participant>.results)."""

    saga_id: str
    step: str
    kind: CommandKind
    idempotency_key: str
    attempt: int
    status: ResultStatus
    retryable: bool = False
    error_type: str | None = None
    error_message: str | None = None
    output: bytes | None = None
    operator: str | None = None  # who answered a deferred command (``saga answer``); None for a handler's reply
    detail: str | None = None  # with ``operator``: why that answer


@dataclass(frozen=True, kw_only=True)
class DeadLetter:
    """A message a service could not process, kept with its original bytes (topic saga.dlq)."""

    source_topic: str
    source_partition: int
    source_offset: int
    consumer: str
    reason: str
    failed_at: int  # epoch milliseconds
    saga_id: str | None = None
    original_key: bytes | None = None
    original_value: bytes | None = None
    original_headers: tuple[tuple[str, bytes | None], ...] = ()

    @property
    def message_id(self) -> str:
        """The letter's message id (``ids.dead_letter_message_id`` of its source position)."""
        return dead_letter_message_id(position_id(self.source_topic, self.source_partition, self.source_offset))
