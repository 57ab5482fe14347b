"""An operator's levers on one saga (``OperateSaga`` on saga.control), decided like every other message.

Each lever either applies, recorded as ``OperatorAction`` (its ``action``, the operator, and as ``detail`` the
step and the reason given) followed by what it changes, or is refused, recorded as ``OperatorActionRefused``
with why, and changes nothing else. Levers:

- ``RetryNow`` STEP: a step waiting on its retry backoff is sent at once, as the attempt that was due, under
  its same key (the participant answers a repeat from its record); so is a compensation waiting on its retry
  backoff. The retry's timer, when it fires later, is stale and changes nothing.
- ``Skip`` STEP (a reason is required): a step its definition declares ``skippable`` that is stuck (in flight,
  timed out, or waiting on a retry) in a RUNNING saga is recorded as skipped (``StepSkipped``, the step
  ``waived``) and the saga goes on as if it had succeeded, without its output: its dependents run. It is not
  undone if the saga unwinds later, and its replies and timers change nothing from then on; whether it took
  effect is the operator's to answer for (``saga verify`` expects at most one effect of it).
- ``ForceCompensate`` (a reason is required): a RUNNING saga, or one that ended FAILED, unwinds: every step
  that took effect and has an undo is undone, dependents first, the pivot too (by its undo) when it passed;
  steps without an undo keep what they did. The one way to compensate after a successful pivot, recorded as
  forced (``OperatorAction`` ForceCompensate, ``SagaCompensationStarted`` "forced by an operator: ...").
- ``Terminate`` (a reason is required): a saga that has not ended, or waits for an operator after a
  compensation failed, ends TERMINATED as it stands (``SagaTerminated``), nothing compensated and nothing sent:
  for a saga settled by hand. Its timers are stale from then on and late replies change nothing.
- ``Pause``: a RUNNING or COMPENSATING saga sends nothing more and none of its timers acts (they are dropped,
  its deadline too); replies that come meanwhile are recorded, and a cancel, a resume or a release is taken,
  but what they would send waits. ``Unpause`` sends again what is open (each in-flight step as a new attempt
  under its same key, a retry that was due at once) and the saga goes on; its deadline is armed again (one
  that passed meanwhile cancels it then, as it would have).
- ``Redrive`` (a reason is required: what was fixed): a saga that ended FAILED (a forward step failed for good,
  typically after its pivot, where the saga only moves forward) runs again: RUNNING once more, each step that
  failed for good is sent again with a fresh attempt budget (its retry policy counts the attempts from the
  re-drive on), a step that was still in flight when the saga failed is sent again too, and the saga goes on
  from there. Refused for any other status (a FAILED saga was never cancelled and undid nothing: an unwinding
  that undoes something ends COMPENSATED), and for a saga whose failure mode goes on past a failure (its later
  steps were skipped, which is final).

  A re-driven step keeps its idempotency key (``{saga_id}:{step}``, frozen) and its attempt numbers go on from
  the last one (attempt n + 1, n + 2, ...): nothing new is derived, so the key and every message id stay a
  function of the history. The participant's ledger takes a recorded definitive failure up again for a later
  attempt of the same key (``participants.kit.ledger.claim``: a failure left no business change behind, so
  running the handler again applies nothing twice), while a recorded success still answers every attempt, so a
  step whose outcome was unknown (given up after timeouts) is not done twice. A new key per re-drive would not
  be answered from that record, would escape the tombstone a later compensation leaves under the step's key,
  and would fail the orchestrator's check of the key a reply carries; restarting at attempt 1 would be
  answered with the recorded failure and its reply dropped as a duplicate (reply message ids are
  ``{key}:reply:{attempt}``).
- ``Migrate`` (a reason is optional; ``OperateSaga.definition_version`` names the version): a RUNNING saga (paused
  or not) moves to another version of its type, when what it did fits that version
  (``migration.migration_problem``): recorded as ``OperatorAction`` Migrate then ``SagaMigrated``, after which the
  saga is folded and decided by the target (``DefinitionRegistry.for_history``), and the target's steps that are
  ready are sent at once (unless paused). The caller hands ``operate`` the target from its registry; a version it
  does not have is refused, naming it.
- ``DlqReplay`` (a reason is required: which letter, and why) records only: ``saga dlq replay`` published a
  dead letter of the saga again (the replayed record does whatever it does). Recorded whatever the saga's
  status (``model.RECORDED_ONLY``), also while it is quarantined, rejected or purged.
"""

from __future__ import annotations

from collections.abc import Callable

from ...schemas import event_types as ev
from ...schemas.message_types import (
    ACTION_RULES,
    Lever,
    OperateSaga,
)
from .builder import DecisionBuilder, in_flight, needs_resolution, send_step, to_undo, withdraw
from .definition import FailureMode, SagaDefinition
from .migration import migration_problem
from .model import SagaStatus, StepStatus
from .progress import advance, resend_open, retry_compensation, unwind


def operate(b: DecisionBuilder, message: OperateSaga, target: SagaDefinition | None = None) -> None:
    """Apply the lever ``message`` pulls, or record why it cannot apply (``b.defn`` is only needed by levers not
    ``RECORDED_ONLY``). ``target``: for a Migrate, the definition of the version it names (None: not registered)."""
    pull = _LEVERS.get(message.action)
    if pull is None and message.action != Lever.MIGRATE:
        refuse(b, message, f"unknown lever {message.action!r} (known: {', '.join(Lever)})")
    elif (problem := ACTION_RULES[message.action].problem(message.step, message.reason)) is not None:
        refuse(b, message, problem)  # the table's rule, the one every face checks before sending
    elif pull is None:
        _migrate(b, message, target)  # the one lever that needs more than the saga's own definition
    else:
        pull(b, message)


def refuse(b: DecisionBuilder, message: OperateSaga, reason: str) -> None:
    """Record that the lever ``message`` pulls cannot apply (``reason``); nothing else changes."""
    b.record(ev.OperatorActionRefused(**b.base(), action=message.action, step=message.step,
                                      operator=message.operator, reason=reason))


def _applied(b: DecisionBuilder, message: OperateSaga) -> None:
    detail = ": ".join(part for part in (message.step, message.reason) if part) or None
    b.record(ev.OperatorAction(**b.base(), action=message.action, operator=message.operator, detail=detail))


def _named_step(b: DecisionBuilder, message: OperateSaga) -> str | None:
    """The step a lever that acts on one names, or None, its refusal recorded, when it names none of the saga's."""
    name = message.step
    if name is None or not b.defn.has_step(name):
        refuse(b, message, f"{message.action} needs one of the saga's steps ({', '.join(b.defn.order)}), "
                           f"got {name!r}")
        return None
    return name


def _retry_now(b: DecisionBuilder, message: OperateSaga) -> None:
    state = b.saga
    name = _named_step(b, message)
    if name is None:
        return
    if state.status not in (SagaStatus.RUNNING, SagaStatus.COMPENSATING):
        refuse(b, message, f"saga is {state.status}: nothing waits to be retried")
        return
    if state.paused:
        refuse(b, message, "saga is paused: unpause it, which sends what is open")
        return
    step = state.steps[name]
    if step.status is StepStatus.RETRY_SCHEDULED and state.status is SagaStatus.RUNNING:
        _applied(b, message)
        send_step(b, name, step.attempt)
    elif step.status is StepStatus.TIMED_OUT and state.status is SagaStatus.RUNNING:
        _applied(b, message)  # it waits for an answer that may not come: the next attempt goes now
        send_step(b, name, step.attempt + 1)
    elif step.status is StepStatus.COMPENSATION_RETRY_SCHEDULED:
        _applied(b, message)
        retry_compensation(b, name, step.compensation_attempt)
    else:
        refuse(b, message, f"step {name} is {step.status}, not waiting on a retry backoff or an answer")
        return
    advance(b)


def _terminate(b: DecisionBuilder, message: OperateSaga) -> None:
    state = b.saga
    if state.is_terminal and state.status not in (SagaStatus.COMPENSATION_FAILED, SagaStatus.FAILED):
        refuse(b, message, f"saga already {state.status}: only a saga that has not ended, or one that waits for a "
                           "human (FAILED, COMPENSATION_FAILED), can be terminated")
        return
    _applied(b, message)
    if not state.is_terminal:  # what is in flight must not run after the saga was settled by hand
        for name in b.defn.order:
            if in_flight(state.steps[name]) or state.steps[name].status is StepStatus.WITHDRAWING:
                withdraw(b, name, f"the saga was terminated: {message.reason}", wait=False)
    b.record(ev.SagaTerminated(**b.base(), reason=message.reason or ""))  # the table required one (operate)


def _pause(b: DecisionBuilder, message: OperateSaga) -> None:
    state = b.saga
    if state.status not in (SagaStatus.RUNNING, SagaStatus.COMPENSATING):
        refuse(b, message, f"saga is {state.status}: only a RUNNING or COMPENSATING saga can be paused")
    elif state.paused:
        refuse(b, message, "saga is already paused")
    else:
        _applied(b, message)


def _unpause(b: DecisionBuilder, message: OperateSaga) -> None:
    if not b.saga.paused:
        refuse(b, message, "saga is not paused")
        return
    _applied(b, message)
    if b.saga.status in (SagaStatus.RUNNING, SagaStatus.COMPENSATING):
        resend_open(b)
        advance(b)


def _skip(b: DecisionBuilder, message: OperateSaga) -> None:
    state = b.saga
    name = _named_step(b, message)
    if name is None:
        return
    if not b.defn.step(name).skippable:
        refuse(b, message, f"step {name} is not skippable: its definition must say so (skippable=True)")
        return
    if state.status is not SagaStatus.RUNNING or state.paused:
        refuse(b, message, f"saga is {'paused' if state.paused else state.status}: only a running saga's step can "
                           "be skipped")
        return
    step = state.steps[name]
    if step.status not in (StepStatus.RUNNING, StepStatus.TIMED_OUT, StepStatus.RETRY_SCHEDULED,
                           StepStatus.AWAITING_SIGNAL):
        refuse(b, message, f"step {name} is {step.status}: only a step in flight, waiting on a retry or waiting for "
                           "a signal can be skipped")
        return
    flying = in_flight(step)
    _applied(b, message)
    b.record(ev.StepSkipped(**b.base(), step=name, reason=f"skipped by an operator: {message.reason}"))
    if flying:  # the attempt in flight must not run after the operator settled the step
        withdraw(b, name, f"an operator skipped the step: {message.reason}", wait=False)
    advance(b)


def _force_compensate(b: DecisionBuilder, message: OperateSaga) -> None:
    state, definition = b.saga, b.defn
    if state.status not in (SagaStatus.RUNNING, SagaStatus.FAILED) or state.paused:
        refuse(b, message, f"saga is {'paused' if state.paused else state.status}: only a RUNNING or FAILED saga "
                           "can be compensated by force")
        return
    steps = state.steps.values()
    if not any(to_undo(definition, step) or needs_resolution(definition, step) or in_flight(step) for step in steps):
        refuse(b, message, "nothing it did has an undo, and nothing is in flight")
        return
    _applied(b, message)
    unwind(b, f"forced by an operator: {message.reason}", None)
    advance(b)


def _redrive(b: DecisionBuilder, message: OperateSaga) -> None:
    state, definition = b.saga, b.defn
    if message.step is not None:
        refuse(b, message, f"{Lever.REDRIVE} names no step: it sends every step that failed for good again")
        return
    if state.status is not SagaStatus.FAILED:
        refuse(b, message, f"saga is {state.status}: only a FAILED saga can be re-driven")
        return
    if definition.failure_mode is not FailureMode.FAIL_FAST:
        refuse(b, message, f"its failure mode is {definition.failure_mode}: the steps after a failure were "
                           "skipped, so re-driving cannot run them")
        return
    if any(step.landed_late for step in state.steps.values()):
        refuse(b, message, "the saga turned back and what could be undone was: it cannot run forward again; settle "
                           "what took effect by hand, then terminate it")
        return
    if not any(step.status is StepStatus.FAILED for step in state.steps.values()):
        refuse(b, message, "no step failed for good: nothing to send again")
        return
    _applied(b, message)  # every FAILED step is PENDING again (evolve), its attempts so far spent
    resend_open(b)  # steps still in flight when the saga failed: their replies were not taken since
    advance(b)


def _migrate(b: DecisionBuilder, message: OperateSaga, target: SagaDefinition | None) -> None:
    state, source, version = b.saga, b.defn, message.definition_version
    if message.step is not None:
        refuse(b, message, f"{Lever.MIGRATE} names no step: it moves the whole saga")
        return
    if version is None:
        refuse(b, message, f"{Lever.MIGRATE} needs the version to move to (definition_version)")
        return
    if target is None or (target.saga_type, target.version) != (state.saga_type, version):
        refuse(b, message, f"no definition {state.saga_type} v{version} is registered in this orchestrator")
        return
    if (problem := migration_problem(state, source, target)) is not None:
        refuse(b, message, problem)
        return
    b.record(ev.OperatorAction(**b.base(), action=message.action, operator=message.operator,
                               detail=": ".join(part for part in (f"v{source.version} to v{version}", message.reason)
                                                if part)))
    b.definition = target  # SagaMigrated is applied by the target: the saga's steps become its steps
    b.record(ev.SagaMigrated(**b.base(), from_version=source.version, to_version=version,
                             to_fingerprint=target.fingerprint, operator=message.operator, reason=message.reason))
    advance(b)  # what the target has ready now (a step it added whose dependencies are done) goes out


def _dlq_replay(b: DecisionBuilder, message: OperateSaga) -> None:
    _applied(b, message)


_LEVERS: dict[str, Callable[[DecisionBuilder, OperateSaga], None]] = {
    Lever.RETRY_NOW: _retry_now, Lever.SKIP: _skip, Lever.FORCE_COMPENSATE: _force_compensate,
    Lever.TERMINATE: _terminate, Lever.PAUSE: _pause, Lever.UNPAUSE: _unpause, Lever.REDRIVE: _redrive,
    Lever.DLQ_REPLAY: _dlq_replay,
}

