"""The system on a three-broker KRaft cluster (``saga infra up --brokers 3``, on loopback): its topics are
replicated three times with two in sync, and 2,000 trip sagas all end as their scenario says while the broker
leading ``saga.events`` partitions is killed with -9 and started again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from rich.console import Console

from bench.chaos_support import publish_paced, started_and_ready
from saga_orchestrator.cli.run_cmd import health_port
from saga_orchestrator.infra import launcher
from saga_orchestrator.infra.health_server import fetch_health
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.infra.launcher.private import private_settings
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.verify import verify_system
from saga_orchestrator.orchestrator.bootstrap import definitions, participants_of
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.topics import Topics
from tests.chaos.conftest import private_stack_settings
from tests.conftest import module_stack, run_sync
from tests.e2e.harness import Stack

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

SAGAS = 2000
RATE = 100.0  # sagas per second: 20 s of load
KILL_AT_S, RESTART_AT_S = 6.0, 12.0
MIX = ("happy", "happy", "happy", "card_declined", "invalid_route")
STATUS_OF = {"SagaCompleted": "COMPLETED", "SagaCompensated": "COMPENSATED"}


@pytest.fixture(scope="module")
def cluster(launcher_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    servers = private_settings(launcher_settings, tmp_path_factory.mktemp("cluster-home"), brokers=3)
    try:
        run_sync(launcher.up(servers, Console(quiet=True)))
        yield servers
    finally:
        run_sync(launcher.down(servers, Console(quiet=True)))


@pytest.fixture(scope="module")
def stack(cluster: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = private_stack_settings(cluster, "cluster", saga_topic_replication_factor=3,
                                      saga_topic_min_insync_replicas=2)
    log_dir: Path = tmp_path_factory.mktemp("cluster-logs")
    yield from module_stack(started_and_ready(settings, log_dir), log_dir)


async def _described(kafka: KafkaClients, names: list[str]) -> tuple[list[dict[str, object]], dict[str, str]]:
    async with kafka.started_admin() as admin:
        topics = await admin.describe_topics(names)
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name, configs={"min.insync.replicas": None}) for name in names])
    min_insync = {name: str(value) for response in responses
                  for _code, _message, _type, name, entries, *_ in response.resources
                  for key, value, *_rest in entries if key == "min.insync.replicas"}
    return topics, min_insync


async def test_topics_are_replicated_three_times_two_in_sync(stack: Stack) -> None:
    settings = stack.settings
    names = Topics(settings.saga_topic_prefix).all(participants_of(definitions(settings)))
    topics, min_insync = await _described(settings.kafka(), list(names))
    assert len(topics) == len(names) >= 10
    for topic in topics:
        partitions = topic["partitions"]
        assert isinstance(partitions, list) and partitions, topic
        assert {len(partition["replicas"]) for partition in partitions} == {3}, topic
        assert {partition["leader"] for partition in partitions} <= {1, 2, 3}, topic
    assert min_insync == {name: "2" for name in names}


async def test_every_service_is_ready(stack: Stack) -> None:
    # GET /ready answers 200 only once the service's consumer joined its group and both servers answer
    settings = stack.settings
    for label in stack.labels:
        body = await fetch_health(settings.saga_health_host, health_port(settings, label), "/ready")
        assert body is not None and json.loads(body)["ready"] is True, (label, body)


async def _leaders(kafka: KafkaClients, topic: str) -> Counter[int]:
    """How many partitions of ``topic`` each broker leads."""
    topics, _ = await _described(kafka, [topic])
    partitions: list[dict[str, int]] = topics[0]["partitions"]  # type: ignore[assignment]
    return Counter(partition["leader"] for partition in partitions)


async def _led_elsewhere(kafka: KafkaClients, topic: str, gone: int, timeout_s: float = 30) -> Counter[int]:
    """The leaders of ``topic`` once none of its partitions is led by broker ``gone`` any more."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            leaders = await _leaders(kafka, topic)
            if leaders and gone not in leaders and -1 not in leaders:
                return leaders
        except Exception:  # the metadata of a broker that just died: ask again
            pass
        assert time.monotonic() < deadline, f"{topic} still led by the killed broker {gone}"
        await asyncio.sleep(0.2)


async def test_sagas_ride_out_the_events_leader_killed(stack: Stack, cluster: Settings) -> None:
    settings = stack.settings
    saga_ids = [f"cluster-{index:04d}" for index in range(SAGAS)]
    events = Topics(settings.saga_topic_prefix).events
    leader = (await _leaders(settings.kafka(), events)).most_common(1)[0][0]
    starts = {saga_id: wire.encode_start(SCENARIOS[MIX[index % len(MIX)]].start(saga_id))
              for index, saga_id in enumerate(saga_ids)}
    publishing = asyncio.create_task(publish_paced(settings, starts, RATE))
    await asyncio.sleep(KILL_AT_S)
    await launcher.kill_kafka(cluster, leader)
    killed_at = time.monotonic()
    await _led_elsewhere(settings.kafka(), events, leader)  # the other two took its partitions over
    await asyncio.sleep(max(0.0, RESTART_AT_S - KILL_AT_S - (time.monotonic() - killed_at)))
    assert not publishing.done()  # sagas were still starting while the broker was away
    await launcher.start_kafka(cluster, leader)
    await publishing

    report = await verify_system(settings, saga_ids, wait_s=300)
    assert report.ok, (report.not_terminal[:5], report.violations[:5])
    assert report.started == SAGAS
    conn = await asyncpg.connect(settings.dsn())
    try:
        status = dict(await conn.fetch("SELECT saga_id, status FROM saga.saga_summary WHERE saga_id = ANY($1)",
                                       saga_ids))
    finally:
        await conn.close()
    wrong = {saga_id: status.get(saga_id) for index, saga_id in enumerate(saga_ids)
             if status.get(saga_id) != STATUS_OF[SCENARIOS[MIX[index % len(MIX)]].terminal]}
    assert not wrong, list(wrong.items())[:5]
    assert stack.exited() == {}, stack.exited()
