"""Moving running trips to a new version, against the real orchestrator on Kafka and Postgres: 50 trips wait on
v1 (paused, their participants not started yet), one of them unwinding after a cancel; `saga definitions migrate
trip --from 1 --to 2` lists what each would do, then moves the 49 running ones to v2 (a wait for a signal after
the charge) and records the unwinding one's refusal; once unpaused every trip ends, the 49 on v2 through their
new step, and `saga audit` and `saga verify` agree afterwards."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator

import asyncpg
import pytest

from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.topics import Topics
from tests.chaos.crash_tools import wait_until_ready
from tests.e2e.harness import Stack, publish, saga_cli, sagas_by_version, terminal_events, wait_for

pytestmark = pytest.mark.e2e

BOTH = "saga_orchestrator.participants.trip:TRIP,bench.trip_changes:WAIT_AFTER_CHARGE_V2"
WORKER = "flight+hotel+payment+notification"
TRIPS = 50
REFUSED = "saga is COMPENSATING: only a RUNNING saga moves to another version"


@pytest.fixture(scope="module")
def migrate_settings(settings: Settings) -> Settings:
    # v2 is deployed but drains: new trips start on v1, as they did before v2 was there.
    return settings.model_copy(update={"saga_participants": WORKER, "saga_definitions": BOTH,
                                       "saga_draining": "trip:2"})


@pytest.fixture(scope="module")
def stack(migrate_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack(migrate_settings, tmp_path_factory.mktemp("logs"))
    try:
        yield running
    finally:
        running.stop()


async def _count_events(settings: Settings, event_type: str) -> int:
    conn = await asyncpg.connect(settings.dsn())
    try:
        return int(await conn.fetchval("SELECT count(*) FROM saga.events WHERE event_type = $1", event_type))
    finally:
        await conn.close()


async def _cli_ok(settings: Settings, *args: str) -> str:
    result = await saga_cli(settings, *args, timeout_s=90)
    assert result.returncode == 0, (args, result.stdout[-3000:], result.stderr[-3000:])
    return result.stdout


async def test_running_trips_move_to_v2_but_the_unwinding_one_and_all_then_end(
        stack: Stack, migrate_settings: Settings) -> None:
    settings = migrate_settings
    stack.start("orchestrator")  # no participant worker yet: the trips wait on their bookings
    await wait_until_ready(stack, ["orchestrator"])
    trips = sorted(f"move-{uuid.uuid4().hex[:8]}" for _ in range(TRIPS))
    for saga_id in trips:
        await publish(settings, Topics(settings.saga_topic_prefix).start, saga_id.encode(),
                      wire.encode_start(SCENARIOS["happy"].start(saga_id)))

    async def all_running() -> bool:
        return await sagas_by_version(settings) == {("RUNNING", 1): TRIPS}
    assert await wait_for(all_running, 30), await sagas_by_version(settings)
    await _cli_ok(settings, "bulk", "start", "pause", "--type", "trip", "--state", "RUNNING", "--operator", "ops",
                  "--reason", "hold for the move", "--rate", "1000", "--yes")

    async def all_paused() -> bool:
        return await _count_events(settings, "OperatorAction") == TRIPS
    assert await wait_for(all_paused, 30), await _count_events(settings, "OperatorAction")
    unwinding = trips[0]
    await _cli_ok(settings, "cancel", unwinding, "--reason", "changed plans", "--operator", "ops", "--force")

    async def one_unwinding() -> bool:
        return await sagas_by_version(settings) == {("RUNNING", 1): TRIPS - 1, ("COMPENSATING", 1): 1}
    assert await wait_for(one_unwinding, 30), await sagas_by_version(settings)

    planned = await _cli_ok(settings, "definitions", "migrate", "trip", "--from", "1", "--to", "2", "--dry-run")
    assert f"{TRIPS} sagas of trip run on v1: {TRIPS - 1} would migrate to v2, 1 would be refused" in planned, planned
    assert f"{unwinding}  refused: {REFUSED}" in planned and planned.count("would migrate\n") == TRIPS - 1, planned
    assert await sagas_by_version(settings) == {("RUNNING", 1): TRIPS - 1, ("COMPENSATING", 1): 1}  # a dry run

    moved = await _cli_ok(settings, "definitions", "migrate", "trip", "--from", "1", "--to", "2", "--operator", "ops",
                          "--reason", "receipts for every trip", "--rate", "1000")
    assert f"{TRIPS - 1} migrated, 1 refused" in moved and f"{unwinding}  refused: {REFUSED}" in moved, moved
    assert re.search(r"bulk job \d+ started: 50 sagas", moved), moved
    assert await sagas_by_version(settings) == {("RUNNING", 2): TRIPS - 1, ("COMPENSATING", 1): 1}
    [v1, v2] = [json.loads(line) for line in (await _cli_ok(settings, "definitions", "trip", "--json")).splitlines()]
    assert [(v["version"], v["sagas"]["running"]) for v in (v1, v2)] == [(1, 1), (2, TRIPS - 1)], (v1, v2)

    await _cli_ok(settings, "bulk", "start", "unpause", "--type", "trip", "--operator", "ops", "--reason", "go on",
                  "--rate", "1000", "--yes")
    stack.start(WORKER)
    ended = await terminal_events(settings, trips, 60)
    assert {saga_id: (type(event).__name__, event.definition_version) for saga_id, event in ended.items()} == {
        **{saga_id: ("SagaCompleted", 2) for saga_id in trips[1:]}, unwinding: ("SagaCancelled", 1)}
    assert await _count_events(settings, "SagaMigrated") == TRIPS - 1
    assert await _count_events(settings, "SignalAwaited") == TRIPS - 1  # v2's step ran in each moved trip

    audited = await saga_cli(settings, "audit", timeout_s=120)
    assert audited.returncode == 0, audited.stdout[-3000:] + audited.stderr[-3000:]
    verified = await saga_cli(settings, "verify", *trips, timeout_s=120)
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
