"""The test kit's own typed records win over a record of the same name that a deployment loaded earlier in the
process put on the default schema path."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from saga_orchestrator.authoring import Saga, SagaApp, StepContext, participant
from saga_orchestrator.schemas import registry
from saga_orchestrator.testing import SagaEnvironment

LOANS_SCHEMAS = Path(__file__).resolve().parents[2] / "examples" / "loans" / "schemas"


class Application(BaseModel):  # saga.v1.loan.Application, as examples/loans has one with other fields
    applicant: str


bank = participant("bank")


@bank.action
async def approve(step: StepContext, application: Application) -> None:
    return None


loan = Saga("loan", input=Application)
loan.step(approve)


async def test_a_typed_record_wins_over_one_of_its_name_a_deployment_put_on_the_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_deployment_folders", [])
    registry.use_schema_folder(LOANS_SCHEMAS)  # what loading the loans app does, for the rest of the process
    assert "loan_id" in str(registry.default_registry().schema("saga.v1.loan.Application").schema)
    env = SagaEnvironment(SagaApp(sagas=[loan], participants=[bank]))
    result = await env.result(await env.start(loan, Application(applicant="ada")))
    assert result.status == "COMPLETED"
