"""``saga history ID --follow`` against a real Postgres: it waits for the saga, prints each event as it is
recorded and exits when the saga ends."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import Sequence

import asyncpg
import pytest

from saga_orchestrator.orchestrator.store.postgres import migrate
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import Event
from saga_orchestrator.testing.history import SagaRun

pytestmark = pytest.mark.integration


def _compensated_trip(saga_id: str) -> list[Event]:
    run = SagaRun(TRIP, saga_id=saga_id)
    run.start()
    run.ok("book_flight")
    run.fail("book_hotel", error="SoldOut")
    run.comp_ok("book_flight")
    return run.events


async def _record(conn: asyncpg.Connection, events: Sequence[Event]) -> None:
    await conn.executemany("INSERT INTO saga.events (saga_id, seq, event_type, body) VALUES ($1, $2, $3, $4)",
                           [(e.saga_id, e.seq, type(e).__name__, wire.encode_event(e)) for e in events])


async def test_follow_waits_for_the_saga_prints_its_events_as_recorded_and_exits_when_it_ends(
        database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    await migrate(conn)
    saga_id = f"follow-{uuid.uuid4().hex[:8]}"
    history = _compensated_trip(saga_id)
    follower = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "saga_orchestrator.cli", "history", saga_id, "--follow", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "DATABASE_URL": database_url, "COLUMNS": "200"})
    try:
        assert follower.stdout is not None
        # Record nothing before it says it waits: on a loaded machine its start alone can take seconds.
        first = await asyncio.wait_for(follower.stdout.readline(), 30)
        assert first.decode().rstrip("\n") == f"waiting for saga {saga_id} to start (Ctrl-C to stop)"
        assert follower.returncode is None, "it stopped before the saga started"
        await _record(conn, history[:2])
        await asyncio.sleep(1)
        assert follower.returncode is None, "it stopped before the saga ended"
        await _record(conn, history[2:])
        out, err = await asyncio.wait_for(follower.communicate(), 30)
    finally:
        if follower.returncode is None:
            follower.kill()
        await conn.close()
    assert follower.returncode == 0, err.decode()
    shown = [json.loads(line) for line in out.decode().splitlines()]
    assert [(row["event"], row["seq"]) for row in shown] == [(type(e).__name__, e.seq) for e in history]
    assert shown[-1]["event"] == "SagaCompensated"
