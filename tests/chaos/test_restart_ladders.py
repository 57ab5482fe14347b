"""A restart of Postgres never sends healthy work down an isolation ladder.

Every service hands its work to ``infra.isolation.IsolationLadder``, which isolates what fails for a reason of
its own and hands a platform fault back, to be waited out. Here the orchestrator (its messages and its due
timers, its relay running beside them) and a participant worker run in this process on a private Postgres,
which is restarted as ``pg_ctl restart -m fast`` does it while their pools hold idle connections: the server
sends each connection its FATAL notice and closes it. The restart runs while this event loop cannot turn, so
every notice and every end of a socket waits in the kernel; then the loop turns 0 to 3 times before the work
is handed over. asyncpg reports each moment differently: a connection "closed in the middle of operation"
once it read the notice as the reply to a statement, and only "cannot switch to state N; another operation
(2) is in progress" when it read the notice before the statement and the socket's end not yet.

Each failure must be the platform's (the work is handed over again at once, as the hardest case), no rung
below the batch may be taken, and the work ends as it would have without the restart: no saga quarantined,
no command dead-lettered.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import asyncpg
import pytest

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.failures import Fault, classify, describe
from saga_orchestrator.infra.health import ServiceHealth
from saga_orchestrator.infra.isolation import BELOW_THE_BATCH
from saga_orchestrator.infra.launcher.postgres import PostgresLauncher
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.bootstrap import Orchestrator, build, prepare
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry
from saga_orchestrator.orchestrator.inbound import Envelope
from saga_orchestrator.orchestrator.service import Outcome
from saga_orchestrator.orchestrator.store.postgres import PostgresStore, migrate
from saga_orchestrator.participants.host import ParticipantHost
from saga_orchestrator.participants.kit.handling import Disposition
from saga_orchestrator.participants.registry import get_participant
from saga_orchestrator.participants.trip import TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import SagaQuarantined
from tests.chaos.conftest import private_stack_settings
from tests.integration.test_participants import command, delivered

pytestmark = pytest.mark.chaos

T = TypeVar("T")
T0 = 1_800_000_000_000
TURNS = (0, 1, 2, 3)  # turns of the event loop between the restart and the hand-over


@dataclass
class Restarts:
    """Restarts of the private Postgres with this event loop held, and the platform faults the work met after."""

    servers: Settings
    pools: list[asyncpg.Pool] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)

    async def restart(self, turns: int) -> None:
        """Every pooled connection open and idle (as between two batches of a busy service), then a fast
        restart during which this loop cannot turn, then ``turns`` turns of the loop."""
        for pool in self.pools:
            size = pool.get_max_size()
            await asyncio.gather(*(pool.fetchval("SELECT pg_sleep(0.02)") for _ in range(size)))
        launcher = PostgresLauncher(self.servers)
        launcher.stop(_quiet)  # SIGINT: the fast shutdown; each backend sends FATAL 57P01 and exits
        launcher.start(_quiet)  # pg_ctl start -w: accepting connections again
        for _ in range(turns):
            await asyncio.sleep(0)

    async def until_through(self, work: Callable[[], Awaitable[T]]) -> T:
        """``work``, handed over again at once after each failure, which must be a platform fault."""
        for _ in range(20):
            try:
                return await work()
            except Exception as error:
                assert classify(error) is Fault.PLATFORM, f"a restart raised {describe(error)}: not the platform's"
                self.faults.append(describe(error))
        raise AssertionError(f"still failing after 20 hand-overs: {self.faults[-3:]}")


def _quiet(_: str) -> None:
    """The launcher's progress, not shown."""


@pytest.fixture
async def restarts(private_servers: Settings) -> AsyncIterator[Restarts]:
    yield Restarts(private_servers)
    # The next test finds the server up whatever happened here.
    launcher = PostgresLauncher(private_servers)
    if launcher.pid() is None:
        launcher.start(_quiet)


@dataclass
class Running:
    """The orchestrator wired on its own pool, its relay running, on a clock the test moves."""

    built: Orchestrator
    pool: asyncpg.Pool
    now_ms: list[int]


@pytest.fixture
async def orchestrator(private_servers: Settings) -> AsyncIterator[Running]:
    settings = private_stack_settings(private_servers, "ladders", saga_inbox_retention_hours=0,
                                      saga_retention_days=0)
    await prepare(settings)  # the topics its relay publishes to
    pool = await create_pool(settings.dsn(), 6)
    await migrate(pool)
    now_ms = [T0]
    built = build(settings, pool, DefinitionRegistry([TRIP]), ServiceHealth("restart-test"), with_relay=True,
                  clock=lambda: now_ms[0])
    stop = asyncio.Event()
    assert built.relay is not None
    relay = asyncio.create_task(built.relay.run(stop))
    try:
        yield Running(built, pool, now_ms)
    finally:
        stop.set()
        await relay
        await pool.close()


def _rungs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{record.getMessage()} ({getattr(record, 'error', '')})" for record in caplog.records
            if record.getMessage() in BELOW_THE_BATCH]


async def _quarantined(pool: asyncpg.Pool, saga_ids: list[str]) -> list[str]:
    store = PostgresStore(pool)
    return [saga_id for saga_id in saga_ids if any(isinstance(wire.decode_event(row.body), SagaQuarantined)
                                                  for row in await store.load_events(saga_id))]


async def test_the_orchestrators_messages_and_timers_ride_out_restarts(
        orchestrator: Running, restarts: Restarts, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="saga.isolation")
    service, pool = orchestrator.built.service, orchestrator.pool
    restarts.pools.append(pool)
    started: list[str] = []
    for turns in TURNS:
        saga_ids = [f"restart-{turns}-{n}-{uuid.uuid4().hex[:6]}" for n in range(3)]
        batch = [Envelope(SCENARIOS["happy"].start(saga_id), f"m-{saga_id}") for saga_id in saga_ids]
        await restarts.restart(turns)
        outcomes = await restarts.until_through(functools.partial(service.handle_many, batch))
        assert outcomes == [Outcome.APPLIED] * 3, (turns, outcomes)
        started += saga_ids

        # An hour later both first steps of each are overdue: their timeouts fire on the timers' ladder.
        orchestrator.now_ms[0] += 3_600_000
        await restarts.restart(turns)
        fired = await restarts.until_through(lambda: service.fire_due_timers(100))
        assert fired >= 6, (turns, fired)  # and the retries of the earlier sagas

    assert restarts.faults, "no restart met the work: the test did not test anything"
    print(f"platform faults met: {sorted(set(restarts.faults))}")
    assert _rungs(caplog) == []
    assert await _quarantined(pool, started) == []


async def test_a_participant_workers_commands_ride_out_restarts(
        private_servers: Settings, restarts: Restarts, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="saga.isolation")
    settings = private_stack_settings(private_servers, "ladders_participant", saga_participant_retention_hours=0)
    await prepare(settings)  # the results topic its relay publishes to
    flight = get_participant("flight")
    host = ParticipantHost(flight, settings)
    pool = await host.start()
    restarts.pools.append(pool)
    try:
        for turns in TURNS:
            batch = [delivered(flight, *command(f"restart-{turns}-{n}-{uuid.uuid4().hex[:6]}", "book_flight",
                                                "book_flight")) for n in range(3)]
            await restarts.restart(turns)
            # The worker's own caller: it waits out a platform fault and hands the batch over again.
            assert await host.process_batch(batch) == [Disposition.RECORDED] * 3, turns
    finally:
        await host.stop()
    faults = [record for record in caplog.records if record.getMessage() == "waiting out a platform fault"]
    assert faults, "no restart met the work: the test did not test anything"
    print(f"platform faults met: {sorted({getattr(record, 'error', '') for record in faults})}")
    assert _rungs(caplog) == []
