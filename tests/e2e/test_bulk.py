"""A bulk operation through the real services: a dry run counts the checkouts whose confirmation waits an hour;
a job whose lever none of them can take counts each refusal; a bulk job the orchestrator runs terminates each
of them, every saga's history names the job, and `saga audit` and `saga verify` agree afterwards."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from saga_orchestrator.cli.demo_cmd import DEMO_TIMEOUT_S
from saga_orchestrator.client import SagaClient
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.schemas.event_types import SagaTerminated
from tests.chaos.crash_tools import started_and_ready
from tests.conftest import module_stack
from tests.e2e.harness import Stack, saga_cli, wait_for
from tests.e2e.test_levers import _history, _waiting

pytestmark = pytest.mark.e2e

SELECTION = ("--type", "patient_checkout", "--state", "RUNNING", "--participant", "mail")


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("logs")
    patient = settings.model_copy(update={"saga_app": "tests.e2e.apps:PATIENT", "saga_participants": ""})
    yield from module_stack(started_and_ready(patient, log_dir), log_dir)


async def test_a_bulk_job_terminates_the_sagas_its_dry_run_counted(stack: Stack) -> None:
    async with SagaClient.from_settings(stack.settings) as client:
        waiting = [await _waiting(client, "bulk") for _ in range(3)]
        ids = sorted(saga_id for saga_id, _ in waiting)

        counted = await saga_cli(stack.settings, "bulk", "count", *SELECTION)
        assert counted.returncode == 0, counted.stdout + counted.stderr
        assert "3 sagas match (type patient_checkout, state RUNNING, stuck at participant mail)" in counted.stdout
        assert ", ".join(ids) in counted.stdout

        # A lever that applies to none of them (they are not paused): each saga refuses it, and the job says so.
        unpause = await saga_cli(stack.settings, "bulk", "start", "unpause", *SELECTION, "--operator", "lou",
                                 "--reason", "wrong lever", "--rate", "10", "--yes")
        assert unpause.returncode == 0, unpause.stdout + unpause.stderr
        refusing = re.search(r"bulk job (\d+) started: 3 sagas", unpause.stdout)
        assert refusing is not None, unpause.stdout

        async def all_refused() -> bool:
            shown = await saga_cli(stack.settings, "bulk", "show", refusing.group(1))
            return "done 3 of 3, 3 refused by their saga" in shown.stdout

        assert await wait_for(all_refused, 60, 0.5), "the unpause job did not count 3 refusals"
        started = await saga_cli(stack.settings, "bulk", "start", "terminate", *SELECTION, "--operator", "lou",
                                 "--reason", "confirmed by phone", "--rate", "2", "--yes")
        assert started.returncode == 0, started.stdout + started.stderr
        found = re.search(r"bulk job (\d+) started: 3 sagas", started.stdout)
        assert found is not None, started.stdout
        job = found.group(1)
        results = [await handle.result(timeout_s=DEMO_TIMEOUT_S) for _, handle in waiting]
    assert all(isinstance(result, SagaTerminated) and result.reason == "confirmed by phone" for result in results)

    for saga_id in ids:
        events = await _history(stack, saga_id)
        assert [(e["event"], e.get("operator")) for e in events[-2:]] == [
            ("OperatorAction", f"lou (bulk job {job})"), ("SagaTerminated", None)], events[-2:]
    shown = await saga_cli(stack.settings, "bulk", "show", job)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "DONE" in shown.stdout and "done 3 of 3" in shown.stdout, shown.stdout
    recount = await saga_cli(stack.settings, "bulk", "count", *SELECTION)
    assert recount.returncode == 0 and "0 sagas match" in recount.stdout, recount.stdout + recount.stderr

    audited = await saga_cli(stack.settings, "audit", timeout_s=120)
    assert audited.returncode == 0, audited.stdout + audited.stderr
    verified = await saga_cli(stack.settings, "verify", *ids)
    assert verified.returncode == 0, verified.stdout + verified.stderr
