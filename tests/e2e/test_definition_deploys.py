"""Deploying a changed trip while trips run, against the real orchestrator on Kafka and Postgres: an edit in
place that changes their path, or a version removed, is refused at start with the count and the difference; a
change of policy, or a new version beside the old, starts, and the running trips finish on the shape they
started on while new ones take the new version."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from bench import trip_changes
from saga_orchestrator.cli.run_cmd import service_environment
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.participants.trip import TRIP
from tests.chaos.crash_tools import wait_until_ready
from tests.e2e.harness import Stack, sagas_by_version, start_happy_trips, terminal_events, wait_for

pytestmark = pytest.mark.e2e

ORIGINAL = "saga_orchestrator.participants.trip:TRIP"
WORKER = "flight+hotel+payment+notification"
RUNNING_TRIPS = 4


@pytest.fixture(scope="module")
def deploy_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"saga_participants": WORKER, "saga_definitions": ORIGINAL})


@pytest.fixture(scope="module")
def stack(deploy_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack(deploy_settings, tmp_path_factory.mktemp("logs"))
    try:
        yield running
    finally:
        running.stop()


def _refused(settings: Settings, definitions: str) -> list[str]:
    """Start the orchestrator with ``definitions``: it must refuse (exit code 2, no traceback); what it said, from
    its ``error:`` line on."""
    result = subprocess.run([sys.executable, "-P", "-m", "saga_orchestrator.cli", "run", "orchestrator"],
                            capture_output=True, text=True, timeout=120,
                            env={**service_environment(settings), "SAGA_DEFINITIONS": definitions})
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stdout + result.stderr, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("{")]  # no log line
    return said[next(n for n, line in enumerate(said) if line.startswith("error:")):]


async def test_a_deploy_that_would_change_running_trips_is_refused_and_one_beside_them_runs_both(
        stack: Stack, deploy_settings: Settings) -> None:
    # Trips wait on their first steps: the orchestrator runs, no participant worker yet.
    stack.start("orchestrator")
    await wait_until_ready(stack, ["orchestrator"])
    waiting = await start_happy_trips(deploy_settings, "deploy", RUNNING_TRIPS)

    async def all_running() -> bool:
        return await sagas_by_version(deploy_settings) == {("RUNNING", 1): RUNNING_TRIPS}
    assert await wait_for(all_running, 60), await sagas_by_version(deploy_settings)
    stack.stop()

    said = _refused(deploy_settings, "bench.trip_changes:CHECK_BEFORE_CHARGE")
    assert said[0] == ("error: this deploy would strand running sagas (SAGA_ALLOW_STRANDING=true starts anyway and "
                       "quarantines them):"), said
    assert said[1].startswith(f"trip v1: {RUNNING_TRIPS} running sagas started on shape {TRIP.fingerprint} "
                              "would be quarantined: the deployed v1 has shape "
                              f"{trip_changes.CHECK_BEFORE_CHARGE.fingerprint}"), said
    assert "step 'fraud_check' added before pivot 'charge_card'" in said[1] and len(said) == 2, said
    assert "step 'send_receipt' added" in _refused(deploy_settings, "bench.trip_changes:STEP_AFTER_CHARGE")[1]
    assert "step 'charge_card' removed" in _refused(deploy_settings, "bench.trip_changes:NO_CHARGE")[1]
    assert _refused(deploy_settings, "bench.trip_changes:FLIGHT_ONLY")[1] == (
        f"trip v1: {RUNNING_TRIPS} running sagas would be quarantined: v1 is not deployed (deployed: v2); keep it "
        "beside the new version until they end")
    assert await sagas_by_version(deploy_settings) == {("RUNNING", 1): RUNNING_TRIPS}  # nothing was touched

    # A change of policy in place, and v2 beside v1: it starts; the running trips finish on v1, new ones on v2.
    beside = "bench.trip_changes:PATIENT,bench.trip_changes:FLIGHT_ONLY"
    stack.start("orchestrator", WORKER, extra_env={"SAGA_DEFINITIONS": beside})
    await wait_until_ready(stack, ["orchestrator", WORKER])
    new = await start_happy_trips(deploy_settings, "deploy", 2)
    ended = await terminal_events(deploy_settings, [*waiting, *new], 90)
    assert {saga_id: type(event).__name__ for saga_id, event in ended.items()} == {
        saga_id: "SagaCompleted" for saga_id in [*waiting, *new]}
    assert {saga_id: event.definition_version for saga_id, event in ended.items()} == {
        **{saga_id: 1 for saga_id in waiting}, **{saga_id: 2 for saga_id in new}}
    assert await sagas_by_version(deploy_settings) == {("COMPLETED", 1): RUNNING_TRIPS, ("COMPLETED", 2): 2}
