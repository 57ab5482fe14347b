"""Several instances of every service, steady load: two orchestrators and two workers of each participant.

The orchestrators split the partitions so that each saga stays on one of them (no saga's events are appended
by both: ``saga_concurrency_conflicts_total`` stays 0), each fires the timers of its own partitions only (no
``StepTimedOut`` while every participant answers), and every saga ends as its scenario says.

Not here yet (issue #7): one orchestrator killed -9 and one paused past a step timeout, and a worker killed
during this run (``test_participant_workers.py`` kills one on its own).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from bench.chaos_support import publish_paced
from saga_orchestrator.cli.run_cmd import health_port
from saga_orchestrator.infra.health_server import fetch_health
from saga_orchestrator.infra.launcher.private import free_port_block
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.verify import verify_system
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from tests.conftest import module_stack
from tests.e2e.harness import Stack, settled_group, start_stack

pytestmark = pytest.mark.timeout(600)

SAGAS = 1000
RATE = 50.0
MIX = ("happy", "happy", "card_declined", "invalid_route")
STATUS_OF = {"SagaCompleted": "COMPLETED", "SagaCompensated": "COMPENSATED"}
PARTICIPANTS = ("flight", "hotel", "payment", "notification")


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("scale-out-logs")
    ports = free_port_block(7)  # the five of saga run all, and the second orchestrator's
    with_health = settings.model_copy(update={"saga_health_port": ports})
    yield from module_stack(start_stack(with_health, log_dir), log_dir)


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


async def test_two_of_each_service_share_the_load(stack: Stack) -> None:
    settings = stack.settings
    prefix = settings.saga_topic_prefix
    groups = [f"{prefix}saga-orchestrator", *(f"{prefix}saga-participant-{p}" for p in PARTICIPANTS)]
    # The second instances join groups that already run: two orchestrators joining a new group at the same
    # moment have stalled their join for a minute (seen twice in four tries; to be found and fixed).
    for group in groups:
        await settled_group(settings.kafka(), group, members=1)
    second_port = settings.saga_health_port + 5
    stack.start_another("orchestrator", "orchestrator-2", {"SAGA_HEALTH_PORT": str(second_port)})
    for participant in PARTICIPANTS:
        stack.start_another(participant, f"{participant}-2")
    orchestrators = await settled_group(settings.kafka(), f"{prefix}saga-orchestrator", members=2)
    assert orchestrators[0].isdisjoint(orchestrators[1])
    assert orchestrators[0] | orchestrators[1] == set(range(settings.saga_topic_partitions))
    for participant in PARTICIPANTS:
        await settled_group(settings.kafka(), f"{prefix}saga-participant-{participant}", members=2)

    saga_ids = [f"scale-{index:04d}" for index in range(SAGAS)]
    starts = {saga_id: wire.encode_start(SCENARIOS[MIX[index % len(MIX)]].start(saga_id))
              for index, saga_id in enumerate(saga_ids)}
    await publish_paced(settings, starts, RATE)
    report = await verify_system(settings, saga_ids, wait_s=180)
    assert report.ok, (report.not_terminal[:5], report.violations[:5])

    conn = await asyncpg.connect(settings.dsn())
    try:
        status = dict(await conn.fetch("SELECT saga_id, status FROM saga.saga_summary WHERE saga_id = ANY($1)",
                                       saga_ids))
        timed_out = await conn.fetchval("SELECT count(*) FROM saga.events WHERE event_type = 'StepTimedOut'"
                                        " AND saga_id = ANY($1)", saga_ids)
    finally:
        await conn.close()
    wrong = {saga_id: status.get(saga_id) for index, saga_id in enumerate(saga_ids)
             if status.get(saga_id) != STATUS_OF[SCENARIOS[MIX[index % len(MIX)]].terminal]}
    assert not wrong, list(wrong.items())[:5]
    assert timed_out == 0  # every participant answered: a timer fired against the wrong read horizon would show

    handled = []
    for port in (health_port(settings, "orchestrator"), second_port):
        metrics = await fetch_health(settings.saga_health_host, port, "/metrics")
        health = await fetch_health(settings.saga_health_host, port)
        assert metrics is not None and health is not None, port
        assert _metric(metrics.decode(), "saga_concurrency_conflicts_total") == 0
        handled.append(json.loads(health)["messages_handled"])
    assert min(handled) > SAGAS, handled  # both took a share (five messages a saga, split by partition)
    assert stack.exited() == {}, stack.exited()
