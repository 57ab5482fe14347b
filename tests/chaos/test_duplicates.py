"""Every command and every result delivered three times, the copies late and out of order.

One saga per scenario (and a few more happy ones) run while a Duplicator re-publishes each record of every
<p>.commands and <p>.results topic twice more; the outcome must not change at all: the same terminal states
and effect counts as without duplicates, no business effect twice for one idempotency key, nothing
dead-lettered, and ``verify_system`` content.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from saga_orchestrator.cli.demo_cmd import drive
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.verify import verify_system
from saga_orchestrator.orchestrator.bootstrap import prepare
from saga_orchestrator.participants.runner import app_id
from saga_orchestrator.participants.trip import PARTICIPANTS
from saga_orchestrator.participants.trip.effects import effects_by_idempotency_key_counts
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas.topics import Topics
from tests.chaos.crash_tools import scenario_problems
from tests.chaos.tools.duplicator import Duplicator
from tests.chaos.tools.kafka_tools import dead_letter_positions, read_all, wait_caught_up, wait_consumers_up
from tests.conftest import run_sync
from tests.e2e.harness import Stack

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

EXTRA_HAPPY = 3
TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("logs")
    run_sync(prepare(settings))
    running = Stack(settings, log_dir)
    running.start()
    yield running
    running.stop()
    print(f"service logs: {log_dir}")


async def _end_offsets(settings: Settings, topics: list[str]) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_servers(), enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        if len(partitions) < len(topics):
            await consumer._client.force_metadata_update()
            partitions = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t))]
        ends: dict[TopicPartition, int] = await consumer.end_offsets(partitions)
        return ends
    finally:
        await consumer.stop()


async def _distinct_messages(settings: Settings, topics: list[str],
                             since: dict[TopicPartition, int]) -> set[tuple[str, str]]:
    """(topic, message_id) of every record published after ``since``: each message once, however often
    it was delivered (replies to a copied command repeat the original reply's id)."""
    found = set()
    for topic in topics:
        for record in await read_all(settings, topic):
            if record.offset >= since[TopicPartition(topic, record.partition)]:
                message_id = dict(record.headers or ()).get("message_id", b"").decode()
                found.add((topic, message_id or f"{record.partition}:{record.offset}"))
    return found


async def test_duplicated_and_reordered_commands_and_results_change_nothing(stack: Stack) -> None:
    settings = stack.settings
    topics = Topics(settings.saga_topic_prefix)
    run_id = uuid.uuid4().hex[:6]
    await wait_consumers_up(settings)
    dead_letters = await dead_letter_positions(settings)

    duplicated = [topic for p in PARTICIPANTS for topic in (topics.commands(p), topics.results(p))]
    duplicator = Duplicator(settings, duplicated, copies=2, shuffle_window=50, seed=7)
    stop = asyncio.Event()
    task = asyncio.create_task(duplicator.run(stop))
    await asyncio.wait_for(duplicator.ready.wait(), 30)
    before = await _end_offsets(settings, duplicated)

    planned = {f"dup-{run_id}-{name}": name for name in SCENARIOS}
    planned |= {f"dup-{run_id}-happy-{i}": "happy" for i in range(2, 2 + EXTRA_HAPPY)}
    ended = await drive(settings, planned, TIMEOUT_S)
    report = await verify_system(settings, saga_ids=planned, wait_s=30)
    # Let the last copies go out and every consumer work through them before judging the effects.
    await asyncio.sleep(1.0)
    stop.set()
    await task
    groups = {f"{settings.saga_topic_prefix}saga-orchestrator": [topics.results(p) for p in PARTICIPANTS]}
    groups |= {app_id(p, settings): [topics.commands(p)] for p in PARTICIPANTS}
    lagging = await wait_caught_up(settings, groups, TIMEOUT_S)
    assert not lagging, f"consumers did not catch up with the copies: {lagging}"

    messages = await _distinct_messages(settings, duplicated, before)
    print(f"\n{len(messages)} distinct commands and results; the duplicator saw {duplicator.seen} records and "
          f"injected {duplicator.injected} copies ({dict(duplicator.injected_by_topic)})")
    assert duplicator.injected == 2 * duplicator.seen
    assert duplicator.injected >= 2 * len(messages) > 0

    pool = await asyncpg.create_pool(settings.dsn(), min_size=1, max_size=2)
    try:
        wrong = await scenario_problems(pool, planned, ended)
        doubled = await effects_by_idempotency_key_counts(pool, only_duplicates=True)
    finally:
        await pool.close()
    assert not wrong, wrong
    assert not any(doubled.values()), f"double effects: {doubled}"
    final = await verify_system(settings, saga_ids=planned)
    assert report.ok and final.ok, (final.violations, final.not_terminal)
    assert await dead_letter_positions(settings) == dead_letters, "a copy was dead-lettered"
    assert not stack.exited(), f"services exited: {stack.exited()}"
