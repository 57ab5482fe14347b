"""The orchestrator's dead-letter index on a real Kafka and Postgres: what the orchestrator dead-letters it indexes,
the console lists it from the index, a replay publishes it again (and, failing again, it is a new letter), a
restart, even one that lost the positions read, adds no row twice, and a letter replayed before the index existed
(recorded only in its saga's history) is indexed replayed."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from saga_orchestrator.console.app import console_app
from saga_orchestrator.console.identity import add_user
from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.health import ServiceHealth
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.dead_letters import read_parked
from saga_orchestrator.orchestrator.bootstrap import build, prepare
from saga_orchestrator.orchestrator.outbound import summary_of
from saga_orchestrator.orchestrator.ports import StoredEvent, Writes
from saga_orchestrator.orchestrator.store.dead_letters import PostgresDeadLetterIndex
from saga_orchestrator.orchestrator.store.postgres import PostgresStore, migrate
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.message_types import DeadLetter, Lever
from saga_orchestrator.schemas.topics import Topics
from saga_orchestrator.testing.history import SagaRun
from tests.e2e.harness import index_dead_letters, publish, read_topic, wait_for

pytestmark = pytest.mark.integration
SIGNED = {"Authorization": "Basic " + base64.b64encode(b"anna:a long password").decode()}
TIMEOUT_S = 60.0


class Running:
    """The orchestrator (with its relay) running in this process until ``stop``."""

    def __init__(self, settings: Settings, pool: asyncpg.Pool) -> None:
        self.settings, self.pool, self._stop = settings, pool, asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        registry, _, _ = await prepare(self.settings)
        self._stop = asyncio.Event()
        orchestrator = build(self.settings, self.pool, registry, ServiceHealth("test"), with_relay=True)
        self._task = asyncio.create_task(orchestrator.run(self._stop))

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task


@pytest.fixture
async def pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    await prepare(settings)
    opened = await create_pool(settings.dsn(), 8)
    await migrate(opened)
    yield opened
    await opened.close()


async def _rows(pool: asyncpg.Pool) -> list[tuple[int, int, str | None]]:
    return [(r["dlq_partition"], r["dlq_offset"], r["saga_id"]) for r in await pool.fetch(
        "SELECT dlq_partition, dlq_offset, saga_id FROM saga.dead_letters ORDER BY 1, 2")]


async def _until_rows(pool: asyncpg.Pool, count: int) -> None:
    async def there() -> bool:
        return len(await _rows(pool)) >= count
    assert await wait_for(there, TIMEOUT_S), f"indexed: {await _rows(pool)}"


async def test_what_the_orchestrator_dead_letters_is_indexed_listed_replayed_and_kept_once(
        settings: Settings, pool: asyncpg.Pool, tmp_path: Path) -> None:
    topics = Topics(settings.saga_topic_prefix)
    garbage = b"\xc3\x01not-avro-at-all"
    start = SCENARIOS["happy"].start("dl-cruise")
    cruise = wire.encode_start(type(start)(saga_id="dl-cruise", saga_type="cruise", tenant_id=None,
                                           input=start.input))
    await publish(settings, topics.start, b"dl-garbage", garbage)
    await publish(settings, topics.start, b"dl-cruise", cruise)
    orchestrator = Running(settings, pool)
    await orchestrator.start()
    try:
        await _until_rows(pool, 2)
    finally:
        await orchestrator.stop()
    indexed = await _rows(pool)
    assert sorted(saga_id or "" for _, _, saga_id in indexed) == ["dl-cruise", "dl-garbage"]  # its key

    # A restart reads on from the kept positions; one that lost them reads saga.dlq again, and rewrites nothing.
    read_to = await PostgresDeadLetterIndex(pool).positions()
    await pool.execute("DELETE FROM saga.dead_letter_positions")
    await orchestrator.start()
    try:
        async def caught_up() -> bool:
            return await PostgresDeadLetterIndex(pool).positions() == read_to
        assert await wait_for(caught_up, TIMEOUT_S)
    finally:
        await orchestrator.stop()
    assert await _rows(pool) == indexed

    users = tmp_path / "users"
    add_user(users, "anna", "a long password")
    app = console_app(settings.model_copy(update={"saga_console_levers": True, "saga_console_users": str(users)}))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://console", headers=SIGNED) as client:
        listed = (await client.get("/api/v1/dead-letters")).json()
        assert len(listed) == 2
        letter = next(item for item in listed if item.get("saga_id") == "dl-cruise")
        assert "unknown saga_type 'cruise'" in letter["reason"]
        assert [item["position"] for item in (await client.get("/api/v1/dead-letters?saga=dl-cruise")).json()] == [
            letter["position"]]
        page = await client.get(f"/dead-letters?position={letter['position']}")
        assert page.status_code == 200 and "dl-cruise" in page.text and "dl-garbage" not in page.text
        inbox = (await client.get("/api/v1/inbox?kind=dead_letter")).json()["items"]
        assert len(inbox) == 2
        replayed = (await client.post("/api/v1/dead-letters/replay",
                                      json={"positions": [letter["position"]], "reason": "cruise deployed"})).json()
        assert [r["position"] for r in replayed["replayed"]] == [letter["position"]]
        inbox = (await client.get("/api/v1/inbox?kind=dead_letter")).json()["items"]
        assert [item["saga_id"] for item in inbox] == ["dl-garbage"]  # the replayed letter left the inbox
    starts = [r.value for r in await read_topic(settings, topics.start)]
    assert starts.count(cruise) == 2  # the original and its replay

    # Cruise is still unknown: the replay is dead-lettered again, a new letter, indexed beside the others.
    await orchestrator.start()
    try:
        await _until_rows(pool, 3)
    finally:
        await orchestrator.stop()
    again = [row for row in await _rows(pool) if row not in indexed]
    assert [saga_id for _, _, saga_id in again] == ["dl-cruise"]


async def test_a_letter_replayed_before_the_index_existed_is_indexed_replayed_at_its_recorded_replay(
        settings: Settings, pool: asyncpg.Pool) -> None:
    topics = Topics(settings.saga_topic_prefix)
    flight = topics.results("flight")
    index = PostgresDeadLetterIndex(pool)
    before = await index.count()
    now = time.time_ns() // 1_000_000
    for offset, saga_id in enumerate(("bf-replayed", "bf-fresh")):
        letter = DeadLetter(source_topic=flight, source_partition=0, source_offset=offset, consumer="orchestrator",
                            reason="reply refused: no such attempt", failed_at=now - 5_000, saga_id=saga_id,
                            original_key=saga_id.encode(), original_value=b"reply",
                            original_headers=(("message_id", b"m-original"),))
        await publish(settings, topics.dlq, saga_id.encode(), wire.encode_dead_letter(letter))
    found = {p.letter.saga_id: p for p in await read_parked(settings.kafka(), topics.dlq)
             if p.letter and p.letter.saga_id in ("bf-replayed", "bf-fresh")}
    # Replayed by an orchestrator that kept no index: the replay is recorded in the saga's history only.
    runs = [SagaRun(TRIP, saga_id=saga_id, now=now) for saga_id in ("bf-replayed", "bf-fresh")]
    for run in runs:
        run.start()
    replayed, fresh = runs
    replayed.now = now + 1_000
    replayed.operate(Lever.DLQ_REPLAY, reason=f"letter {found['bf-replayed'].position} from {flight} 0:0 to {flight}")
    other = f"{found['bf-fresh'].partition}:{found['bf-fresh'].offset + 1_000}"
    fresh.operate(Lever.DLQ_REPLAY, reason=f"letter {other} from {flight} 0:1 to {flight}")
    async with PostgresStore(pool).begin() as uow:
        await uow.write(Writes(
            events=[StoredEvent(saga_id=e.saga_id, seq=e.seq, event_type=type(e).__name__, body=wire.encode_event(e),
                                recorded_at_ms=e.occurred_at) for run in runs for e in run.events],
            summaries=[summary_of(run.saga) for run in runs]))

    await index_dead_letters(settings, pool, before + 2)
    rows = {row.saga_id: row for row in await index.at([(p.partition, p.offset) for p in found.values()])}
    assert rows["bf-replayed"].replayed_at_ms == now + 1_000
    assert rows["bf-fresh"].replayed_at_ms is None  # its history records a replay of another letter
    unhandled = {row.saga_id for row in await index.unhandled(None, None, None, 1_000)}
    assert "bf-fresh" in unhandled and "bf-replayed" not in unhandled
