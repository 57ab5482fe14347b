"""The loan's tests: a signal with a timeout, in virtual time; no Kafka, no Postgres, a few milliseconds each."""

from datetime import timedelta

from examples.loans.loan import Application, Approval, Disbursement, app, approval, disburse, loan
from saga_orchestrator.testing import SagaEnvironment, succeed

APPLICATION = Application(loan_id="L-1", applicant="ada", amount_cents=5_000_00)


async def test_an_approval_a_day_later_disburses_the_loan() -> None:
    env = SagaEnvironment(app)
    env.script(disburse, succeed(Disbursement(reference="D-L-1", approved_by="grace")))
    saga_id = await env.start(loan, APPLICATION)
    await env.advance(hours=24)
    await env.signal(saga_id, approval, Approval(approver="grace", limit_cents=10_000_00))
    result = await env.result(saga_id)
    assert result.status == "COMPLETED" and result.elapsed == timedelta(hours=24)
    assert result.outputs["await_approval"] == Approval(approver="grace", limit_cents=10_000_00)


async def test_no_approval_within_48_hours_releases_the_hold() -> None:
    env = SagaEnvironment(app)
    result = await env.result(await env.start(loan, APPLICATION))
    assert result.status == "COMPENSATED" and result.elapsed == timedelta(hours=48)
    assert result.compensated == ["hold_funds"] and result.attempts(disburse) == 0


async def test_an_approval_sent_twice_is_taken_once() -> None:
    env = SagaEnvironment(app)
    saga_id = await env.start(loan, APPLICATION)
    for _ in range(2):
        await env.signal(saga_id, approval, Approval(approver="grace", limit_cents=10_000_00), signal_id="a-1")
    result = await env.result(saga_id)
    assert result.status == "COMPLETED" and result.event_types.count("SignalReceived") == 1
