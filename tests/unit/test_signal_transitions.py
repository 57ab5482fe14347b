"""Given these messages, when this one arrives, then these events and commands: a saga that waits for a signal.

hold (undo: release) → wait for Approval (1 h; fails, or goes on) → disburse (the pivot). Histories are built by
driving ``decide``; the expectations are written out by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from saga_orchestrator.orchestrator.domain.builder import TimerKind
from saga_orchestrator.orchestrator.domain.definition import Expiry, RetryPolicy, SagaDefinition, Step
from saga_orchestrator.orchestrator.domain.state import SagaStatus, StepStatus
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.schemas.message_types import Lever, SignalSaga
from saga_orchestrator.testing.history import Action, SagaRun, command_names, event_names

HOUR_MS = 3_600_000


def _loan(on_expiry: Expiry = Expiry.FAIL) -> SagaDefinition:
    return SagaDefinition(saga_type="loan", version=1, input_schema="x", signals=(("Approval", "x.Approval"),),
                          steps=(Step(name="hold", participant="treasury", command="hold", compensation="release"),
                                 Step(name="approval", participant="", command="", signal="Approval",
                                      depends_on=("hold",), timeout_ms=HOUR_MS, on_expiry=on_expiry,
                                      retry=RetryPolicy(max_attempts=1)),
                                 Step(name="disburse", participant="treasury", command="disburse",
                                      depends_on=("approval",), pivot=True)))


def start() -> Action:
    return lambda r: r.start()


def ok(step: str) -> Action:
    return lambda r: r.ok(step)


def signal(name: str = "Approval", signal_id: str = "a-1", payload: bytes = b"yes") -> Action:
    return lambda r: r.signal(name, payload, signal_id)


def expire() -> Action:
    return lambda r: r.fire(TimerKind.STEP_TIMEOUT, "approval")


def cancel() -> Action:
    return lambda r: r.cancel()


def skip() -> Action:
    return lambda r: r.operate(Lever.SKIP, "approval", reason="approved by phone")


WAITING = [start(), ok("hold")]


@dataclass(frozen=True)
class Case:
    id: str
    given: list[Action]
    when: Action
    events: list[str]
    commands: list[str]
    status: SagaStatus
    on_expiry: Expiry = Expiry.FAIL


CASES = [
    Case("the step before succeeds: the wait begins, nothing is sent", [start()], ok("hold"),
         ["StepSucceeded hold 1", "SignalAwaited approval 1"], [], SagaStatus.RUNNING),
    Case("the signal comes: the wait ends with it, the next step is sent", WAITING, signal(),
         ["SignalReceived", "StepSucceeded approval 1", "StepCommandSent disburse 1"],
         ["treasury.disburse FORWARD 1"], SagaStatus.RUNNING),
    Case("a signal before the wait is kept, and taken when the wait begins", [start(), signal()], ok("hold"),
         ["StepSucceeded hold 1", "SignalAwaited approval 1", "StepSucceeded approval 1",
          "StepCommandSent disburse 1"], ["treasury.disburse FORWARD 1"], SagaStatus.RUNNING),
    Case("the same signal id again: nothing", [*WAITING, signal()], signal(), [], [], SagaStatus.RUNNING),
    Case("another signal of a name taken: refused, recorded", [*WAITING, signal()], signal(signal_id="a-2"),
         ["SignalRefused"], [], SagaStatus.RUNNING),
    Case("a name the saga does not take: refused, recorded", WAITING, signal("Veto"), ["SignalRefused"], [],
         SagaStatus.RUNNING),
    Case("no signal in time: the step fails, the saga turns back", WAITING, expire(),
         ["StepFailed approval 1", "SagaCompensationStarted", "CompensationSent hold 1"],
         ["treasury.release COMPENSATE 1"], SagaStatus.COMPENSATING),
    Case("no signal in time, declared to go on: the next step is sent", WAITING, expire(),
         ["StepSucceeded approval 1", "StepCommandSent disburse 1"], ["treasury.disburse FORWARD 1"],
         SagaStatus.RUNNING, Expiry.GO_ON),
    Case("a cancel while it waits: the wait ends, the hold is released", WAITING, cancel(),
         ["SagaCancelRequested", "StepSkipped approval", "SagaCompensationStarted", "CompensationSent hold 1"],
         ["treasury.release COMPENSATE 1"], SagaStatus.COMPENSATING),
    Case("a signal after the turn-back: refused", [*WAITING, cancel()], signal(), ["SignalRefused"], [],
         SagaStatus.COMPENSATING),
    Case("skipping a wait that is not skippable: refused", WAITING, skip(), ["OperatorActionRefused approval"], [],
         SagaStatus.RUNNING),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_signal_transitions(case: Case) -> None:
    run = SagaRun(_loan(case.on_expiry))
    for action in case.given:
        action(run)
    decision = case.when(run)
    assert event_names(decision) == case.events
    assert command_names(decision) == case.commands
    assert run.saga.status is case.status


def test_a_wait_expires_at_its_timeout_from_when_it_began() -> None:
    run = SagaRun(_loan())
    run.start()
    run.now += 5_000
    awaited = next(e for e in run.ok("hold").events if isinstance(e, ev.SignalAwaited))
    assert awaited.timeout_at == run.now + HOUR_MS
    assert run.saga.steps["approval"].status is StepStatus.AWAITING_SIGNAL
    assert run.armed["STEP_TIMEOUT:approval:1"].due_at == awaited.timeout_at


def test_a_signal_with_start_starts_the_saga_then_takes_the_signal() -> None:
    run = SagaRun(_loan())
    decision = run.send(SignalSaga(saga_id=run.saga_id, signal_id="a-1", signal="Approval", payload=b"yes",
                                   start_saga_type="loan", start_input=b"input"))
    assert event_names(decision) == ["SagaStarted", "StepCommandSent hold 1", "SignalReceived"]
    assert run.saga.signals == {"Approval": ("a-1", b"yes")}
