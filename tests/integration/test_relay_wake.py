"""``OutboxRelay.wake``: rows committed by a writer in the same process are published without a poll wait."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from saga_orchestrator.outbox.relay import OutboxRelay
from tests.integration.test_outbox_relay import messages, relay, write

pytestmark = pytest.mark.integration

# The relay suite's fixtures: pool, a fresh outbox table, a fresh topic.
pytest_plugins = ("tests.integration.test_outbox_relay",)


async def published_within(target: OutboxRelay, rows: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if target.published_total >= rows:
            return True
        await asyncio.sleep(0.01)
    return False


async def test_a_woken_relay_publishes_before_its_next_poll(pool: asyncpg.Pool, table: str, topic: str,
                                                            kafka_bootstrap: str) -> None:
    # Polls so far apart that only a wake-up can explain a quick publish.
    target = relay(pool, table, kafka_bootstrap, min_poll_ms=20_000, max_poll_ms=20_000)
    stop = asyncio.Event()
    running = asyncio.create_task(target.run(stop))
    try:
        await asyncio.sleep(1)  # its first poll found nothing: it sleeps for 20 s now
        await write(pool, table, messages(topic, ["s1"], 2))
        await asyncio.sleep(0.3)
        assert target.is_active and target.published_total == 0  # asleep until its next poll...
        target.wake()
        assert await published_within(target, 2, 5)  # ...or until woken
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
