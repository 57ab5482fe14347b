"""A loan: hold the funds → wait for a person's approval, at most 48 hours → disburse (the pivot) → notify.

The approval is a signal: a reviewer (or the credit service) sends it with ``saga signal``, ``SagaClient.signal``,
the console or a SignalSaga record on saga.control, and ``disburse`` takes it as a typed parameter. Without it
within 48 hours the wait fails and the hold is released.
"""

from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel

from saga_orchestrator.authoring import (
    EffectTable,
    Expiry,
    Saga,
    SagaApp,
    StepContext,
    StepFailed,
    participant,
)


class Application(BaseModel):
    loan_id: str
    applicant: str
    amount_cents: int


class Approval(BaseModel):
    approver: str
    limit_cents: int


class Hold(BaseModel):
    hold_id: str


class Disbursement(BaseModel):
    reference: str
    approved_by: str


def ledger(schema: str) -> str:
    return f"CREATE TABLE IF NOT EXISTS {schema}.ledger (key text PRIMARY KEY, saga_id text, step text, state text)"


LEDGER = EffectTable("ledger", counts={"done": None, "undone": "state = 'released'"})
treasury, notices = (participant(name, tables=[ledger(name)], effects=LEDGER) for name in ("treasury", "notices"))


async def note(step: StepContext, state: str) -> None:
    await step.tx.execute(f"INSERT INTO {step.schema}.ledger VALUES ($1, $2, $3, $4)", step.idempotency_key,
                          step.saga_id, step.step, state)


@treasury.action(effect="done")
async def hold_funds(step: StepContext, application: Application) -> Hold:
    await note(step, "held")
    return Hold(hold_id=f"H-{application.loan_id}")


@hold_funds.undo(effect="undone")
async def release_funds(step: StepContext, application: Application) -> None:
    await step.tx.execute(f"UPDATE {step.schema}.ledger SET state = 'released' WHERE key = $1",
                          f"{step.saga_id}:hold_funds")


@treasury.action(effect="done")
async def disburse(step: StepContext, application: Application, approval: Approval, hold: Hold) -> Disbursement:
    if application.amount_cents > approval.limit_cents:
        raise StepFailed("OverLimit", f"{approval.approver} approved up to {approval.limit_cents} cents")
    await note(step, f"paid from {hold.hold_id}")
    return Disbursement(reference=f"D-{application.loan_id}", approved_by=approval.approver)


@notices.action(effect="done")
async def notify_applicant(step: StepContext, application: Application, disbursement: Disbursement) -> None:
    await note(step, f"told {application.applicant} of {disbursement.reference}")


loan = Saga("loan", input=Application, searchable=("loan_id",))
approval = loan.signal(Approval)
held = loan.step(hold_funds, timeout=timedelta(seconds=2))
approved = loan.wait(approval, after=[held], timeout=timedelta(hours=48), on_expiry=Expiry.FAIL)
paid = loan.step(disburse, after=[approved], pivot=True, timeout=timedelta(seconds=2))
loan.step(notify_applicant, after=[paid])

app = SagaApp(sagas=[loan], participants=[treasury, notices], schema_folder=Path(__file__).parent / "schemas")
