"""Signals: a saga type declares the signals it takes; a step waits for one with a timeout and a declared outcome on
expiry; a signal is taken once per id and once per name, refused with a recorded reason where the saga cannot take
it, and may start its saga. Run on the real pipeline in virtual time (``SagaEnvironment``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import BaseModel

from saga_orchestrator.authoring import Expiry, Saga, StepContext, participant
from saga_orchestrator.orchestrator.domain.errors import DefinitionError
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.testing import SagaEnvironment, defer, succeed


class Application(BaseModel):
    applicant: str
    amount_cents: int


class Approval(BaseModel):
    approver: str
    limit_cents: int


class Hold(BaseModel):
    hold_id: str


class Loan(BaseModel):
    loan_id: str
    approved_by: str | None


lending = participant("lending")


@lending.action
async def hold_funds(step: StepContext, application: Application) -> Hold:
    return Hold(hold_id="h-1")


@hold_funds.undo
async def release_funds(step: StepContext, application: Application, hold: Hold) -> None:
    return None


@lending.action
async def disburse(step: StepContext, application: Application, approval: Approval) -> Loan:
    return Loan(loan_id="l-1", approved_by=approval.approver)


@lending.action
async def disburse_small(step: StepContext, application: Application, approval: Approval | None) -> Loan:
    return Loan(loan_id="l-2", approved_by=None if approval is None else approval.approver)


APPLICATION = Application(applicant="ada", amount_cents=500_00)
APPROVAL = Approval(approver="grace", limit_cents=1_000_00)


def _loan(on_expiry: Expiry = Expiry.FAIL) -> Saga:
    saga = Saga("loan", input=Application)
    approval = saga.signal(Approval)
    held = saga.step(hold_funds, timeout=timedelta(seconds=2))
    approved = saga.wait(approval, after=[held], timeout=timedelta(hours=48), on_expiry=on_expiry)
    saga.step(disburse if on_expiry is Expiry.FAIL else disburse_small, after=[approved], pivot=True)
    return saga


async def test_a_signal_sent_while_the_step_waits_goes_on_into_the_next_steps_typed_parameter() -> None:
    env = SagaEnvironment(_loan())
    saga_id = await env.start("loan", APPLICATION)
    await env.advance(hours=3)
    state = env.state(saga_id)
    assert state is not None and state.steps["await_approval"].status == "AWAITING_SIGNAL"
    await env.signal(saga_id, "Approval", APPROVAL)
    result = await env.result(saga_id)
    assert result.status == "COMPLETED" and result.elapsed == timedelta(hours=3)
    assert result.outputs["await_approval"] == APPROVAL
    command = next(c for c in result.commands if c.step == "disburse")
    assert "await_approval" in dict(command.step_outputs)  # the payload travels as the wait's output
    assert result.attempts("await_approval") == 0  # a wait sends nothing


async def test_a_signal_sent_before_the_step_waits_is_taken_when_it_does() -> None:
    env = SagaEnvironment(_loan())
    env.stop("lending")  # hold_funds waits for its worker: the saga does not wait for the signal yet
    saga_id = await env.start("loan", APPLICATION)
    await env.signal(saga_id, "Approval", APPROVAL)
    await env.start_participant("lending")
    result = await env.result(saga_id)
    assert result.status == "COMPLETED"
    types = result.event_types
    assert types.index("SignalReceived") < types.index("SignalAwaited")


async def test_a_signal_sent_twice_with_one_id_is_taken_once() -> None:
    env = SagaEnvironment(_loan())
    saga_id = await env.start("loan", APPLICATION)
    for _ in range(2):
        await env.signal(saga_id, "Approval", APPROVAL, signal_id="approval-1")
    result = await env.result(saga_id)
    assert result.status == "COMPLETED"
    assert [type(e).__name__ for e in result.events if type(e).__name__.startswith("Signal")] == [
        "SignalAwaited", "SignalReceived"]


async def test_a_second_signal_of_a_taken_name_an_unknown_name_and_one_after_the_end_are_refused_and_recorded(
        ) -> None:
    env = SagaEnvironment(_loan())
    env.script(disburse, defer(succeed(Loan(loan_id="l-1", approved_by="grace")), after=timedelta(seconds=3)))
    saga_id = await env.start("loan", APPLICATION)
    await env.signal(saga_id, "Approval", APPROVAL, signal_id="first")
    await env.signal(saga_id, "Approval", Approval(approver="mallory", limit_cents=1), signal_id="second")
    result = await env.result(saga_id)
    assert result.outputs["await_approval"] == APPROVAL
    await env.signal(saga_id, "Approval", APPROVAL, signal_id="third")
    refused = [e for e in env.history(saga_id) if isinstance(e, ev.SignalRefused)]
    assert [(e.signal_id, e.reason) for e in refused] == [
        ("second", "signal Approval was taken already (signal id first)"),
        ("third", "saga is COMPLETED: it takes signals only while RUNNING")]
    assert refused[0].sender == "test"


async def test_a_signal_its_saga_type_does_not_take_is_refused_naming_those_it_takes() -> None:
    other = Saga("other", input=Application)
    other.signal(Hold)
    other.step(hold_funds)
    env = SagaEnvironment(_loan(), other)
    saga_id = await env.start("loan", APPLICATION)
    await env.signal(saga_id, "Hold", Hold(hold_id="x"))
    refused = [e for e in env.history(saga_id) if isinstance(e, ev.SignalRefused)]
    assert [e.reason for e in refused] == ["saga type loan takes no signal 'Hold' (it takes: Approval)"]


async def test_no_signal_within_the_timeout_fails_the_step_and_the_saga_turns_back() -> None:
    env = SagaEnvironment(_loan())
    result = await env.result(await env.start("loan", APPLICATION))
    assert result.status == "COMPENSATED" and result.elapsed == timedelta(hours=48)
    failed = next(e for e in result.events if isinstance(e, ev.StepFailed))
    assert (failed.step, failed.error_type) == ("await_approval", "SignalTimedOut")
    assert failed.error_message == "no Approval signal within 172800 s"
    assert result.compensated == ["hold_funds"] and result.attempts(disburse) == 0


async def test_no_signal_within_the_timeout_goes_on_without_it_where_declared() -> None:
    env = SagaEnvironment(_loan(Expiry.GO_ON))
    env.script(disburse_small, succeed(Loan(loan_id="l-2", approved_by=None)))
    result = await env.result(await env.start("loan", APPLICATION))
    assert result.status == "COMPLETED" and result.elapsed == timedelta(hours=48)
    assert "await_approval" not in result.outputs
    assert result.attempts(disburse_small) == 1


async def test_a_signal_may_start_its_saga() -> None:
    env = SagaEnvironment(_loan())
    await env.signal("loan-7", "Approval", APPROVAL, start=("loan", APPLICATION))
    await env.signal("loan-7", "Approval", APPROVAL, start=("loan", APPLICATION))  # another id: refused, no restart
    result = await env.result("loan-7")
    assert result.status == "COMPLETED" and result.elapsed == timedelta(0)
    assert result.event_types[:3] == ["SagaStarted", "StepCommandSent", "SignalReceived"]
    assert result.event_types.count("SagaStarted") == 1


async def test_a_cancel_while_a_step_waits_for_a_signal_ends_the_wait_and_the_saga_at_once() -> None:
    env = SagaEnvironment(_loan())
    saga_id = await env.start("loan", APPLICATION)
    await env.advance(hours=1)
    await env.cancel(saga_id, "applicant withdrew")
    result = await env.result(saga_id)
    assert result.status == "CANCELLED" and result.elapsed == timedelta(hours=1)
    skipped = next(e for e in result.events if isinstance(e, ev.StepSkipped))
    assert skipped.step == "await_approval" and skipped.reason.startswith("no longer awaited: the saga turned back")
    assert result.compensated == ["hold_funds"]


async def test_a_skippable_wait_can_be_skipped_by_an_operator() -> None:
    saga = Saga("quick", input=Application)
    approval = saga.signal(Approval)
    waited = saga.wait(approval, timeout=timedelta(hours=1), on_expiry=Expiry.GO_ON, skippable=True)
    saga.step(disburse_small, after=[waited])
    env = SagaEnvironment(saga)
    saga_id = await env.start("quick", APPLICATION)
    await env.skip(saga_id, "await_approval", "approved by phone")
    result = await env.result(saga_id)
    assert result.status == "COMPLETED" and result.elapsed == timedelta(0)


def test_a_wait_for_an_undeclared_signal_and_a_required_output_of_a_wait_that_may_go_on_are_refused() -> None:
    saga = Saga("loan", input=Application)
    foreign = Saga("other", input=Application).signal(Approval)
    with pytest.raises(DefinitionError, match="signal 'Approval' is not one of its own"):
        saga.wait(foreign, timeout=timedelta(hours=1))
    saga.signal(Approval)
    with pytest.raises(DefinitionError, match="signal 'Approval' is declared twice"):
        saga.signal(Approval)
    maybe = Saga("maybe", input=Application)
    waited = maybe.wait(maybe.signal(Approval), timeout=timedelta(hours=1), on_expiry=Expiry.GO_ON)
    maybe.step(disburse, after=[waited])
    with pytest.raises(DefinitionError, match="takes approval: Approval, which no step before it gives for sure"):
        _ = maybe.definition
