"""The gauges read from the tables report what the rows say, on a real Postgres: an outbox row left
unpublished, a timer past its due time, a saga RUNNING for an hour, a compensation retrying for long."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import orjson
import pytest

from saga_orchestrator.infra.health import ServiceHealth
from saga_orchestrator.infra.health import current as current_health
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.bootstrap import run_orchestrator
from saga_orchestrator.orchestrator.domain.builder import TimerKind, timer_id
from saga_orchestrator.orchestrator.domain.model import RESUME_COMPENSATION
from saga_orchestrator.orchestrator.signals import TableSignals
from saga_orchestrator.orchestrator.store.operations.signals import PostgresSignals
from saga_orchestrator.orchestrator.store.postgres import PostgresStore
from saga_orchestrator.outbox.depth import outbox_gauges, refresh_outbox_gauges
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.topics import Topics

pytestmark = pytest.mark.integration

MINUTE_S = 60.0


@pytest.fixture
async def pool(store: PostgresStore) -> asyncpg.Pool:
    """The orchestrator's tables, empty (``store`` empties all but the parked rows)."""
    await store.pool.execute("TRUNCATE saga.outbox_parked")
    return store.pool


def gauge(health: ServiceHealth, name: str, **labels: str) -> float | None:
    return health.registry.get_sample_value(name, labels)


async def _outbox_row(pool: asyncpg.Pool, due_in_s: float, created_ago_s: float) -> None:
    await pool.execute(
        "INSERT INTO saga.outbox (topic, message_key, value, headers, message_id, available_at, created_at)"
        " VALUES ('t', 'k', '\\x00', $1, gen_random_uuid()::text, now() + make_interval(secs => $2),"
        "         now() - make_interval(secs => $3))",
        orjson.dumps({}).decode(), due_in_s, created_ago_s)


async def _summary(pool: asyncpg.Pool, saga_id: str, saga_type: str, status: str, started_ago_s: float) -> None:
    await pool.execute(
        "INSERT INTO saga.saga_summary (saga_id, saga_type, status, started_at, updated_at, last_seq)"
        " VALUES ($1, $2, $3, now() - make_interval(secs => $4), now(), 1)", saga_id, saga_type, status, started_ago_s)


async def _timer(pool: asyncpg.Pool, saga_id: str, kind: str, step: str, attempt: int, due_in_s: float) -> None:
    await pool.execute(
        "INSERT INTO saga.timers (saga_id, timer_id, kind, step, attempt, due_at)"
        " VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))",
        saga_id, timer_id(TimerKind(kind), step, attempt), kind, step, attempt, due_in_s)


async def _event(pool: asyncpg.Pool, event: ev.Event, recorded_ago_s: float) -> None:
    await pool.execute(
        "INSERT INTO saga.events (saga_id, seq, event_type, body, recorded_at)"
        " VALUES ($1, $2, $3, $4, now() - make_interval(secs => $5))",
        event.saga_id, event.seq, type(event).__name__, wire.encode_event(event), recorded_ago_s)


def _retry(saga_id: str, seq: int, step: str, attempt: int) -> ev.CompensationRetryScheduled:
    return ev.CompensationRetryScheduled(saga_id=saga_id, seq=seq, definition_version=1, occurred_at=0, step=step,
                                         attempt=attempt, due_at=0)


async def test_an_outbox_row_left_unpublished_shows_its_age_and_a_held_back_one_only_its_count(
        pool: asyncpg.Pool) -> None:
    health = ServiceHealth("orchestrator")
    await refresh_outbox_gauges(pool, ["saga.outbox"], health)
    assert gauge(health, "saga_outbox_rows", table="saga.outbox") == 0
    assert gauge(health, "saga_outbox_oldest_age_seconds", table="saga.outbox") == 0

    await _outbox_row(pool, due_in_s=-90, created_ago_s=90)  # due 90 s ago, never published
    await _outbox_row(pool, due_in_s=3600, created_ago_s=600)  # held back an hour more: not late
    await pool.execute("INSERT INTO saga.outbox_parked SELECT id, topic, message_key, value, headers, message_id,"
                       " available_at, created_at, now(), 'too large', shard FROM saga.outbox LIMIT 1")
    await refresh_outbox_gauges(pool, ["saga.outbox"], health)
    assert gauge(health, "saga_outbox_rows", table="saga.outbox") == 2
    age = gauge(health, "saga_outbox_oldest_age_seconds", table="saga.outbox")
    assert age is not None and 90 <= age < 150
    assert gauge(health, "saga_outbox_parked_rows", table="saga.outbox") == 1
    assert b'saga_outbox_oldest_age_seconds{table="saga.outbox"}' in await health.metrics()


async def test_the_outbox_chore_refreshes_the_gauges_on_its_first_round(pool: asyncpg.Pool) -> None:
    health = ServiceHealth("orchestrator")
    await _outbox_row(pool, due_in_s=-30, created_ago_s=30)
    chore = outbox_gauges(pool, ["saga.outbox"], health, every_s=3600)
    assert await chore._work() == 0  # one round, as its run loop does at start
    assert gauge(health, "saga_outbox_rows", table="saga.outbox") == 1


async def test_overdue_timers_the_oldest_running_saga_and_long_retrying_compensations_are_reported(
        pool: asyncpg.Pool) -> None:
    health = ServiceHealth("orchestrator")
    signals = TableSignals(PostgresSignals(pool), health, compensation_alert_s=15 * MINUTE_S)
    await signals.refresh()
    assert gauge(health, "saga_timers_overdue") == 0 and gauge(health, "saga_timers_overdue_oldest_age_seconds") == 0
    assert gauge(health, "saga_oldest_running_age_seconds", saga_type="trip") is None

    await _summary(pool, "old", "trip", "RUNNING", started_ago_s=3600)
    await _summary(pool, "new", "trip", "RUNNING", started_ago_s=5)
    await _summary(pool, "ended", "trip", "COMPLETED", started_ago_s=86_400)  # older, but not running
    await _summary(pool, "c-long", "trip", "COMPENSATING", started_ago_s=7200)
    await _summary(pool, "c-short", "trip", "COMPENSATING", started_ago_s=600)
    await _summary(pool, "c-resumed", "trip", "COMPENSATING", started_ago_s=86_400)
    await _timer(pool, "old", "STEP_TIMEOUT", "book_flight", 1, due_in_s=-120)  # two minutes overdue
    await _timer(pool, "new", "STEP_TIMEOUT", "book_flight", 1, due_in_s=30)
    # Retrying for 20 minutes, waiting on its backoff:
    await _timer(pool, "c-long", "COMPENSATION_RETRY", "cancel_hotel", 4, due_in_s=60)
    await _event(pool, _retry("c-long", 5, "cancel_hotel", 2), recorded_ago_s=20 * MINUTE_S)
    await _event(pool, _retry("c-long", 7, "cancel_hotel", 3), recorded_ago_s=10 * MINUTE_S)
    await _event(pool, _retry("c-long", 9, "cancel_hotel", 4), recorded_ago_s=1 * MINUTE_S)
    # Retrying for 5 minutes, its second attempt in flight:
    await _timer(pool, "c-short", "COMPENSATION_TIMEOUT", "cancel_flight", 2, due_in_s=30)
    await _event(pool, _retry("c-short", 4, "cancel_flight", 2), recorded_ago_s=5 * MINUTE_S)
    # Retried a day ago, then COMPENSATION_FAILED and resumed 2 minutes ago: retrying for 2 minutes.
    await _timer(pool, "c-resumed", "COMPENSATION_RETRY", "refund_card", 9, due_in_s=60)
    await _event(pool, _retry("c-resumed", 4, "refund_card", 2), recorded_ago_s=86_000)
    await _event(pool, ev.OperatorAction(saga_id="c-resumed", seq=8, definition_version=1, occurred_at=0,
                                         action=RESUME_COMPENSATION, operator="ana", detail=None),
                 recorded_ago_s=3 * MINUTE_S)
    await _event(pool, _retry("c-resumed", 10, "refund_card", 9), recorded_ago_s=2 * MINUTE_S)
    await signals.refresh()

    assert gauge(health, "saga_timers_overdue") == 1
    overdue = gauge(health, "saga_timers_overdue_oldest_age_seconds")
    assert overdue is not None and 120 <= overdue < 180
    oldest = gauge(health, "saga_oldest_running_age_seconds", saga_type="trip")
    assert oldest is not None and 3600 <= oldest < 3660
    assert gauge(health, "saga_compensations_retrying", saga_type="trip") == 3
    assert gauge(health, "saga_compensations_retrying_too_long", saga_type="trip") == 1

    await pool.execute("DELETE FROM saga.saga_summary WHERE status = 'RUNNING'")
    await pool.execute("DELETE FROM saga.timers WHERE saga_id = 'c-long'")  # its compensation went through
    await signals.refresh()
    assert gauge(health, "saga_oldest_running_age_seconds", saga_type="trip") is None
    assert gauge(health, "saga_compensations_retrying_too_long", saga_type="trip") == 0


async def test_a_running_orchestrator_exports_its_consumer_lag_and_table_gauges(pool: asyncpg.Pool,
                                                                               settings: Settings) -> None:
    group = f"{settings.saga_topic_prefix}saga-orchestrator"
    start_topic = Topics(settings.saga_topic_prefix).start
    stop = asyncio.Event()
    running = asyncio.ensure_future(run_orchestrator(settings, stop))
    try:
        deadline = time.monotonic() + 60
        while True:
            health = current_health()
            scraped = (await health.metrics()).decode()
            lags = {(labels["topic"], labels["partition"]): value for labels, value in _samples(health,
                                                                                                 "saga_consumer_lag")}
            if (health.service == "orchestrator" and 'saga_outbox_rows{table="saga.outbox"} 0.0' in scraped
                    and "saga_timers_overdue 0.0" in scraped
                    and {topic for topic, _ in lags} >= {start_topic}):
                break
            assert time.monotonic() < deadline and not running.done(), scraped
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)
    assert f'saga_consumer_lag{{group="{group}",partition="0",topic="{start_topic}"}} 0.0' in scraped
    assert sorted(int(p) for topic, p in lags if topic == start_topic) == list(range(settings.saga_topic_partitions))
    assert set(lags.values()) == {0.0}  # nothing was published: nothing to read


def _samples(health: ServiceHealth, name: str) -> list[tuple[dict[str, str], float]]:
    return [(sample.labels, sample.value) for family in health.registry.collect() for sample in family.samples
            if sample.name == name]
