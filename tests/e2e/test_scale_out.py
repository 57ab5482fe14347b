"""Several instances of every service under a steady load, while they fail: two orchestrators and two workers of
each participant run 2,000 trip sagas at 40 a second; one orchestrator is killed -9 and restarted, the other is
paused (SIGSTOP) for longer than a step timeout, and a flight worker is killed -9.

In the steady part, before the first kill, the orchestrators split the partitions so that each saga stays on one
of them: no saga's events are appended by both (``saga_concurrency_conflicts_total`` 0 on both). Through the
failures every saga ends as its scenario says, ``saga verify`` is clean, no service restarts its consumer, and no
step times out whose reply was on Kafka before the step's due time (a backlog the new owner of a partition had not
read yet is not a silent participant).

The trip runs with 15 s step timeouts (``patient_trip.py``): the demo's 2 s would compensate the sagas a killed
worker had in hand before its partitions move (its group session lasts 10 s).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from bench.chaos_support import publish_paced
from saga_orchestrator.cli.run_cmd import health_port
from saga_orchestrator.infra.health_server import fetch_health
from saga_orchestrator.infra.isolation import OUTSIDE_ISOLATION
from saga_orchestrator.infra.kafka_admin import settled_group
from saga_orchestrator.infra.launcher.private import free_port_block
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.verify import verify_system
from saga_orchestrator.orchestrator.bootstrap import prepare
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import StepCommandSent, StepTimedOut
from saga_orchestrator.schemas.topics import Topics
from tests.conftest import module_stack
from tests.e2e.harness import Stack, read_topic
from tests.e2e.patient_trip import STEP_TIMEOUT_MS

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

SAGAS = 2000
RATE = 40.0
MIX = ("happy", "happy", "card_declined", "invalid_route")
STATUS_OF = {"SagaCompleted": "COMPLETED", "SagaCompensated": "COMPENSATED"}
PARTICIPANTS = ("flight", "hotel", "payment", "notification")
REPO = Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": str(REPO)}  # the services import the patient trip from the tests package
# When each failure happens, in seconds after the first StartSaga.
KILL_ORCHESTRATOR_AT, RESTART_ORCHESTRATOR_AT = 6.0, 10.0
PAUSE_AT, PAUSE_S = 18.0, STEP_TIMEOUT_MS / 1000 + 5
KILL_WORKER_AT = 30.0


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("scale-out-logs")
    ports = free_port_block(7)  # the five of saga run all, and the second orchestrator's
    patient = settings.model_copy(update={"saga_health_port": ports,
                                          "saga_definitions": "tests.e2e.patient_trip:PATIENT_TRIP"})

    async def starting() -> Stack:
        await prepare(patient)
        started = Stack(patient, log_dir)
        started.start(extra_env=ENV)
        return started

    yield from module_stack(starting(), log_dir)


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


async def _conflicts(settings: Settings, port: int) -> float:
    metrics = await fetch_health(settings.saga_health_host, port, "/metrics")
    assert metrics is not None, port
    return _metric(metrics.decode(), "saga_concurrency_conflicts_total")


async def _at(started: float, moment_s: float) -> None:
    await asyncio.sleep(max(0.0, started + moment_s - time.monotonic()))


async def test_two_of_each_service_share_the_load_through_kills_and_a_pause(stack: Stack) -> None:
    settings = stack.settings
    prefix = settings.saga_topic_prefix
    groups = [f"{prefix}saga-orchestrator", *(f"{prefix}saga-participant-{p}" for p in PARTICIPANTS)]
    for group in groups:  # the second instances join groups that already run, as a scale-out does
        await settled_group(settings.kafka(), group, members=1)
    first_port, second_port = health_port(settings, "orchestrator"), settings.saga_health_port + 5
    second_env = {**ENV, "SAGA_HEALTH_PORT": str(second_port)}
    stack.start_another("orchestrator", "orchestrator-2", second_env)
    for participant in PARTICIPANTS:
        stack.start_another(participant, f"{participant}-2", ENV)
    orchestrators = await settled_group(settings.kafka(), f"{prefix}saga-orchestrator", members=2)
    assert orchestrators[0].isdisjoint(orchestrators[1])
    assert orchestrators[0] | orchestrators[1] == set(range(settings.saga_topic_partitions))
    for participant in PARTICIPANTS:
        await settled_group(settings.kafka(), f"{prefix}saga-participant-{participant}", members=2)

    saga_ids = [f"scale-{index:04d}" for index in range(SAGAS)]
    starts = {saga_id: wire.encode_start(SCENARIOS[MIX[index % len(MIX)]].start(saga_id))
              for index, saga_id in enumerate(saga_ids)}
    started = time.monotonic()
    publishing = asyncio.create_task(publish_paced(settings, starts, RATE))
    paused = stack.processes["orchestrator"].pid
    try:
        await _at(started, KILL_ORCHESTRATOR_AT)
        steady = [await _conflicts(settings, port) for port in (first_port, second_port)]
        stack.kill("orchestrator-2")
        await _at(started, RESTART_ORCHESTRATOR_AT)
        stack.start_another("orchestrator", "orchestrator-2", second_env)
        await _at(started, PAUSE_AT)
        os.kill(paused, signal.SIGSTOP)
        await _at(started, KILL_WORKER_AT)
        stack.kill("flight-2")
        await _at(started, PAUSE_AT + PAUSE_S)
    finally:
        os.kill(paused, signal.SIGCONT)
    await publishing
    assert steady == [0, 0]  # before the first failure no saga was written by both orchestrators

    report = await verify_system(settings, saga_ids, wait_s=240)
    assert report.ok, (report.not_terminal[:5], report.violations[:5])
    conn = await asyncpg.connect(settings.dsn())
    try:
        status = dict(await conn.fetch("SELECT saga_id, status FROM saga.saga_summary WHERE saga_id = ANY($1)",
                                       saga_ids))
        events = [wire.decode_event(row["body"]) for row in await conn.fetch(
            "SELECT body FROM saga.events WHERE saga_id = ANY($1)"
            " AND event_type IN ('StepCommandSent', 'StepTimedOut')", saga_ids)]
    finally:
        await conn.close()
    wrong = {saga_id: status.get(saga_id) for index, saga_id in enumerate(saga_ids)
             if status.get(saga_id) != STATUS_OF[SCENARIOS[MIX[index % len(MIX)]].terminal]}
    assert not wrong, list(wrong.items())[:5]

    # A step timed out only if its reply reached Kafka after the step was due (or never).
    sent_at = {(e.saga_id, e.step, e.attempt): e.occurred_at for e in events if isinstance(e, StepCommandSent)}
    timed_out = [(e.saga_id, e.step, e.attempt) for e in events if isinstance(e, StepTimedOut)]
    replied_at: dict[tuple[str, str, int], int] = {}
    if timed_out:
        topics = Topics(prefix)
        for participant in PARTICIPANTS:
            for record in await read_topic(settings, topics.results(participant), timeout_s=30):
                result = wire.decode_result(record.value)
                key = (result.saga_id, result.step, result.attempt)
                replied_at[key] = min(replied_at.get(key, record.timestamp), record.timestamp)
    early = [(key, replied_at[key] - sent_at[key]) for key in timed_out
             if key in replied_at and replied_at[key] < sent_at[key] + STEP_TIMEOUT_MS]
    assert early == [], f"{len(early)} of {len(timed_out)} timeouts had their reply on Kafka in time: {early[:5]}"

    for label in ("orchestrator", "orchestrator-2", *PARTICIPANTS, *(f"{p}-2" for p in PARTICIPANTS)):
        log = stack.log(label)
        assert OUTSIDE_ISOLATION not in log, label
        assert "Crashed reason" not in log, label
    handled = []
    for port in (first_port, second_port):
        health = await fetch_health(settings.saga_health_host, port)
        assert health is not None, port
        handled.append(json.loads(health)["messages_handled"])
    assert min(handled) > 0, handled
    print(f"{SAGAS} sagas through a kill, a {PAUSE_S:.0f} s pause and a worker kill: {len(timed_out)} steps timed"
          f" out, all with their reply after the due time or none; messages handled {handled}")
    assert stack.exited() == {"flight-2": -9}, stack.exited()
