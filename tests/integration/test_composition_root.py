"""``bootstrap.build`` wires the orchestrator on the pool, definitions and clock it is given, and starts
nothing: a test drives the wired service directly, on a real Postgres."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.health import ServiceHealth
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.bootstrap import build
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry
from saga_orchestrator.orchestrator.inbound import Envelope
from saga_orchestrator.orchestrator.service import Outcome
from saga_orchestrator.orchestrator.store.postgres import PostgresStore, migrate
from saga_orchestrator.participants.trip import TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire

pytestmark = pytest.mark.integration

T0 = 1_800_000_000_000


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    opened = await create_pool(database_url, 4)
    await migrate(opened)
    yield opened
    await opened.close()


async def test_build_wires_the_service_on_the_given_pool_and_clock(pool: asyncpg.Pool, settings: Settings) -> None:
    orchestrator = build(settings.model_copy(update={"saga_inbox_retention_hours": 0, "saga_retention_days": 0}),
                         pool, DefinitionRegistry([TRIP]), ServiceHealth("test"), clock=lambda: T0)
    assert orchestrator.relay is None
    assert sorted(chore.name for chore in orchestrator.chores) == ["bulk jobs", "orchestrator gauges",
                                                                   "outbox gauges"]
    assert not orchestrator.consumer.consuming  # built, not started

    start = SCENARIOS["happy"].start("built-1")
    assert await orchestrator.service.handle(Envelope(start, "m-built-1")) is Outcome.APPLIED
    events = [wire.decode_event(row.body) for row in await PostgresStore(pool).load_events("built-1")]
    assert [type(e).__name__ for e in events] == ["SagaStarted", "StepCommandSent", "StepCommandSent"]
    assert {e.occurred_at for e in events} == {T0}
    assert orchestrator.timers.fired == 0


async def test_build_adds_the_relay_and_the_chores_the_settings_ask_for(pool: asyncpg.Pool,
                                                                       settings: Settings) -> None:
    wanted = settings.model_copy(update={"saga_inbox_retention_hours": 24, "saga_retention_days": 30})
    orchestrator = build(wanted, pool, DefinitionRegistry([TRIP]), ServiceHealth("test"), with_relay=True)
    assert orchestrator.relay is not None and orchestrator.relay.table == "saga.outbox"
    assert sorted(chore.name for chore in orchestrator.chores) == ["bulk jobs", "inbox pruning",
                                                                   "orchestrator gauges", "outbox gauges",
                                                                   "retention policy"]
