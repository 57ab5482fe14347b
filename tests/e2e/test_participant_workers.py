"""Two worker processes of one participant share its commands; one killed with -9 right after a batch committed
(before its offsets) leaves the other to take its partitions over: every saga ends, nothing is booked twice.

The trip's flight step times out after 2 s, three times, while a dead member keeps its partitions for the
workers' session timeout (10 s): sagas whose flight command waited on the dead worker in that window are
compensated, consistently, and ``verify_system`` holds for every saga either way.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from saga_orchestrator.cli.demo_cmd import drive
from saga_orchestrator.cli.run_cmd import service_commands, service_environment
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.verify import verify_system
from tests.conftest import module_stack
from tests.e2e.harness import Stack, start_stack

pytestmark = pytest.mark.timeout(600)
SAGAS = 300
WAVES = 5  # sagas start in waves, so that each worker handles several batches
KILLED_AFTER_COMMITS = 2  # the first worker's second transaction is its last: SIGKILL before its offsets


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("workers-logs")
    yield from module_stack(start_stack(settings, log_dir), log_dir)


def _second_worker(stack: Stack, label: str, home: Path, faults: str) -> subprocess.Popen[bytes]:
    """Another process of participant ``label`` (its own SAGA_HOME, so its faust data folder is its own)."""
    env = {**service_environment(stack.settings), "SAGA_HOME": str(home), "SAGA_FAULTS": faults,
           "SAGA_HEALTH_PORT": "0"}
    log = open(stack.log_dir / f"{label}-2.log", "ab")  # the process keeps writing to it
    process = subprocess.Popen(service_commands(stack.settings)[label], stdout=log, stderr=log, env=env)
    stack.processes[f"{label}-2"] = process
    return process


async def _members(kafka: KafkaClients, group: str) -> list[set[int]]:
    """The partitions of each member of consumer group ``group`` (empty while it rebalances)."""
    admin = kafka.admin()
    await admin.start()
    try:
        [response] = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    members = []
    for _error, _group, state, _type, _protocol, found, *_ in response.groups:
        if state != "Stable":
            return []
        for _id, *_client, assignment in found:
            decoded = ConsumerProtocolMemberAssignment.decode(assignment)
            members.append({number for _topic, numbers in decoded.assignment for number in numbers})
    return members


async def test_two_workers_of_one_participant_and_one_killed_mid_batch(stack: Stack, tmp_path: Path) -> None:
    settings = stack.settings
    group = f"{settings.saga_topic_prefix}saga-participant-flight"
    # the first worker of flight dies on its KILLED_AFTER_COMMITS-th commit; the second stays
    stack.kill("flight")
    stack.start("flight", extra_env={"SAGA_FAULTS": f"participant.after_commit={KILLED_AFTER_COMMITS}"})
    second = _second_worker(stack, "flight", tmp_path / "second-home", "")
    shared = await _settled(settings.kafka(), group, members=2)
    assert shared[0].isdisjoint(shared[1]) and shared[0] | shared[1] == set(range(settings.saga_topic_partitions))

    run_id = uuid.uuid4().hex[:6]
    planned = {f"workers-{run_id}-{n:03d}": "happy" for n in range(SAGAS)}
    ended: dict[str, str] = {}
    wave = SAGAS // WAVES
    for first in range(0, SAGAS, wave):
        ended |= await drive(settings, dict(list(planned.items())[first:first + wave]), 240)
    assert set(ended) == set(planned)
    outcomes = Counter(ended.values())
    print(f"outcomes with one of two flight workers killed: {dict(outcomes)}")
    assert set(outcomes) <= {"SagaCompleted", "SagaCompensated"} and outcomes["SagaCompleted"] > SAGAS // 2, outcomes
    assert stack.processes["flight"].poll() == -9  # it did die mid-run, by its own SIGKILL
    assert second.poll() is None
    report = await verify_system(settings, list(planned))
    assert report.ok, (report.not_terminal[:5], report.violations[:5])  # every effect once, nothing missing
    assert await _settled(settings.kafka(), group, members=1) == [set(range(settings.saga_topic_partitions))]


async def _settled(kafka: KafkaClients, group: str, members: int, timeout_s: float = 60) -> list[set[int]]:
    """The partitions of each member once ``group`` is stable with ``members`` members, each with some."""
    deadline = time.monotonic() + timeout_s
    while len(found := await _members(kafka, group)) != members or not all(found):
        assert time.monotonic() < deadline, f"{group} never settled with {members} members: {found}"
        await asyncio.sleep(0.5)
    return found
