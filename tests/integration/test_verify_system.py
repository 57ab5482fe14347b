"""``verify_system`` and ``saga verify`` on a real Postgres: recorded histories, effects, and tampering."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

from saga_orchestrator.infra.db import create_pool, ms_to_datetime
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.verify import verify_system
from saga_orchestrator.orchestrator.domain.state import SagaState
from saga_orchestrator.orchestrator.outbound import summary_of
from saga_orchestrator.orchestrator.ports import StoredEvent, Writes
from saga_orchestrator.orchestrator.store.postgres import PostgresStore, migrate
from saga_orchestrator.participants.kit.ddl import ensure_participant_schema
from saga_orchestrator.participants.registry import REFERENCE_PARTICIPANTS, get_participant
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import Event
from saga_orchestrator.testing.history import SagaRun

pytestmark = pytest.mark.integration


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    opened = await create_pool(settings.dsn(), 4)
    await migrate(opened)
    for participant in map(get_participant, REFERENCE_PARTICIPANTS):
        await ensure_participant_schema(opened, participant)
    yield opened
    await opened.close()


async def _record(pool: asyncpg.Pool, events: list[Event], state: SagaState) -> None:
    async with PostgresStore(pool).begin() as uow:
        await uow.write(Writes(
            events=[StoredEvent(saga_id=e.saga_id, seq=e.seq, event_type=type(e).__name__,
                                body=wire.encode_event(e), recorded_at_ms=e.occurred_at) for e in events],
            summaries=[summary_of(state)]))


async def _book(pool: asyncpg.Pool, saga_id: str, table: str, step: str, status: str, key: str = "") -> None:
    extra = {"flight.bookings": ("customer_id, origin, destination, depart_date, return_date",
                                 "'c', 'LIS', 'NYC', 'd', 'r'"),
             "hotel.bookings": ("customer_id, destination, check_in, check_out", "'c', 'NYC', 'd', 'r'"),
             "payment.charges": ("customer_id, amount_cents, currency", "'c', 100, 'EUR'"),
             "notification.sent": ("email", "'a@b.test'")}[table]
    status_column = ", status" if table != "notification.sent" else ""
    status_value = ", $4" if table != "notification.sent" else ""
    args = [saga_id, step, key or f"{saga_id}:{step}"] + ([status] if status_column else [])
    await pool.execute(f"INSERT INTO {table} (saga_id, step, idempotency_key, {extra[0]}{status_column})"
                       f" VALUES ($1, $2, $3, {extra[1]}{status_value})", *args)


async def _completed(pool: asyncpg.Pool, saga_id: str) -> None:
    run = SagaRun(TRIP, saga_id=saga_id)
    run.start()
    for step in ("book_flight", "book_hotel", "charge_card", "send_itinerary"):
        run.ok(step)
    await _record(pool, run.events, run.saga)
    await _book(pool, saga_id, "flight.bookings", "book_flight", "booked")
    await _book(pool, saga_id, "hotel.bookings", "book_hotel", "booked")
    await _book(pool, saga_id, "payment.charges", "charge_card", "charged")
    await _book(pool, saga_id, "notification.sent", "send_itinerary", "")


async def _sold_out(pool: asyncpg.Pool, saga_id: str) -> None:
    run = SagaRun(TRIP, saga_id=saga_id)
    run.start()
    run.ok("book_flight")
    run.fail("book_hotel", "SoldOut")
    run.comp_ok("book_flight")
    await _record(pool, run.events, run.saga)
    await _book(pool, saga_id, "flight.bookings", "book_flight", "cancelled")


async def _running(pool: asyncpg.Pool, saga_id: str) -> SagaRun:
    run = SagaRun(TRIP, saga_id=saga_id)
    run.start()
    run.ok("book_flight")
    await _record(pool, run.events, run.saga)
    await _book(pool, saga_id, "flight.bookings", "book_flight", "booked")
    await pool.execute("INSERT INTO saga.timers (saga_id, timer_id, kind, step, attempt, due_at)"
                       " VALUES ($1, 't1', 'STEP_TIMEOUT', 'book_hotel', 1, $2)", saga_id,
                       ms_to_datetime(run.now + 2000))
    await pool.execute("INSERT INTO hotel.outbox (topic, message_key, value, headers, message_id)"
                       " VALUES ('hotel.results', $1, '\\x00', '{}', 'm1')", saga_id)
    return run


async def test_a_consistent_store_verifies_and_an_unfinished_saga_says_where_it_waits(
        pool: asyncpg.Pool, settings: Settings) -> None:
    await _completed(pool, "v-done")
    await _sold_out(pool, "v-sold-out")
    await _running(pool, "v-running")
    report = await verify_system(settings, ["v-done", "v-sold-out", "v-running", "v-never"])
    assert report.violations == []
    assert report.started == 3
    assert report.terminal == {"COMPENSATED": 1, "COMPLETED": 1}
    waiting = {saga_id: (status, why) for saga_id, status, why in report.not_terminal}
    assert waiting.keys() == {"v-running", "v-never"} and not report.ok
    status, why = waiting["v-running"]
    assert status == "RUNNING"
    assert "last event StepSucceeded" in why and "STEP_TIMEOUT book_hotel#1" in why
    assert "hotel.outbox 1" in why and "book_hotel RUNNING" in why
    assert waiting["v-never"][0] == "UNKNOWN"
    assert (await verify_system(settings, ["v-done", "v-sold-out"])).ok


async def test_broken_invariants_are_reported_per_saga(pool: asyncpg.Pool, settings: Settings) -> None:
    await _completed(pool, "t-double")
    await _book(pool, "t-double", "payment.charges", "charge_card", "charged", key="t-double:charge_card:again")
    await _sold_out(pool, "t-kept")
    await pool.execute("UPDATE flight.bookings SET status = 'booked' WHERE saga_id = 't-kept'")
    await _completed(pool, "t-summary")
    await pool.execute("UPDATE saga.saga_summary SET status = 'RUNNING' WHERE saga_id = 't-summary'")
    report = await verify_system(settings, ["t-double", "t-kept", "t-summary"])
    problems = sorted((v.saga_id, v.problem) for v in report.violations)
    assert problems == [
        ("t-double", "charge_card (payment: charged=2, refunded=0): a COMPLETED saga must hold its effect "
                     "exactly once here"),
        ("t-double", "payment.charges: 2 rows for idempotency key t-double:charge_card"),
        ("t-kept", "book_flight (flight: booked=1, cancelled=0): a COMPENSATED saga must have no net effect here"),
        ("t-summary", "saga_summary.status is 'RUNNING', the events say 'COMPLETED'"),
    ]


async def test_wait_rechecks_until_the_sagas_end(pool: asyncpg.Pool, settings: Settings) -> None:
    run = await _running(pool, "w-late")

    async def finish() -> None:
        await asyncio.sleep(0.8)
        before = len(run.events)
        run.ok("book_hotel")
        run.ok("charge_card")
        run.ok("send_itinerary")
        await _record(pool, run.events[before:], run.saga)
        await pool.execute("DELETE FROM saga.timers WHERE saga_id = 'w-late'")
        await pool.execute("DELETE FROM hotel.outbox WHERE message_key = 'w-late'")
        for table, step, status in (("hotel.bookings", "book_hotel", "booked"),
                                    ("payment.charges", "charge_card", "charged"),
                                    ("notification.sent", "send_itinerary", "")):
            await _book(pool, "w-late", table, step, status)

    assert not (await verify_system(settings, ["w-late"])).ok
    report, _ = await asyncio.gather(verify_system(settings, ["w-late"], wait_s=20), finish())
    assert report.ok, report


async def test_the_command_prints_json_and_exits_1_on_a_problem(pool: asyncpg.Pool, settings: Settings) -> None:
    await _completed(pool, "c-ok")
    env = {**os.environ, "DATABASE_URL": settings.dsn(), "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_servers()}

    def verify(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "saga_orchestrator.cli", "verify", "--json", *args], env=env,
                              capture_output=True, text=True, timeout=60)

    good = await asyncio.to_thread(verify, "c-ok")
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout) == {"ok": True, "started": 1, "terminal": {"COMPLETED": 1},
                                       "not_terminal": [], "violations": []}
    bad = await asyncio.to_thread(verify, "c-ok", "c-missing")
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["not_terminal"][0]["saga_id"] == "c-missing"
