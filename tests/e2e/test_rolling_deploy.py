"""A rolling deploy of a new trip version, against real orchestrators on Kafka and Postgres: orchestrator A serves
trip v1 only, B serves v1 and v2 and starts new trips on v2. While trips start, B joins, leaves and joins again,
and the partitions move each time: the group gives them only to the member serving every version, and A, holding
them while B is away, waits for it rather than quarantine the v2 trips. None is quarantined, all complete."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from saga_orchestrator.infra.kafka_admin import group_members
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.topics import Topics
from tests.chaos.crash_tools import wait_until_ready
from tests.e2e.harness import Stack, publish, sagas_by_version, terminal_events

pytestmark = pytest.mark.e2e

OLD = "saga_orchestrator.participants.trip:TRIP"
NEW = f"{OLD},bench.trip_changes:FLIGHT_ONLY"
WORKER = "flight+hotel+payment+notification"
PER_PHASE = 10  # trips started in each of the four phases
EVERY_S = 0.1


@pytest.fixture(scope="module")
def rolling_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"saga_participants": WORKER, "saga_definitions": OLD})


@pytest.fixture(scope="module")
def stack(rolling_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack(rolling_settings, tmp_path_factory.mktemp("logs"))
    try:
        yield running
    finally:
        running.stop()


async def _group_is(settings: Settings, holdings: list[int], timeout_s: float = 30) -> None:
    """Wait until the orchestrators' group is stable with members holding ``holdings`` partitions (any order)."""
    group = f"{settings.saga_topic_prefix}saga-orchestrator"
    deadline = time.monotonic() + timeout_s
    found: list[set[int]] = []
    while time.monotonic() < deadline:
        found = await group_members(settings.kafka(), group)
        if sorted(len(numbers) for numbers in found) == sorted(holdings):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"group not {holdings} in {timeout_s} s: {found}")


async def _start_trips(settings: Settings, saga_ids: list[str], scenario: str = "happy") -> None:
    for saga_id in saga_ids:
        await publish(settings, Topics(settings.saga_topic_prefix).start, saga_id.encode(),
                      wire.encode_start(SCENARIOS[scenario].start(saga_id)))
        await asyncio.sleep(EVERY_S)


async def test_a_rolling_deploy_quarantines_no_trip_while_the_new_instance_comes_and_goes(
        stack: Stack, rolling_settings: Settings) -> None:
    settings = rolling_settings
    partitions = settings.saga_topic_partitions
    stack.start("orchestrator", WORKER)
    await wait_until_ready(stack, ["orchestrator", WORKER])
    await _group_is(settings, [partitions])
    phases = [[f"rolling-{phase}{index:02d}-{uuid.uuid4().hex[:6]}" for index in range(PER_PHASE)]
              for phase in "abcd"]
    new_env = {"SAGA_DEFINITIONS": NEW}
    # A alone: trips start on v1.
    await _start_trips(settings, phases[0])
    # B joins: it serves more, so it takes every partition and A none; trips start on v2 (its latest), their
    # charge answering slowly, so that they are still running when B goes.
    stack.start_another("orchestrator", "orchestrator-b", new_env)
    await _group_is(settings, [0, partitions], 60)
    await _start_trips(settings, phases[1], "card_slow")
    # B restarts: A holds the partitions meanwhile, and the v2 trips' replies reach it; it waits for B.
    leaving = stack.processes["orchestrator-b"]
    leaving.terminate()
    await asyncio.to_thread(leaving.wait, 30)
    await _group_is(settings, [partitions], 60)
    await _start_trips(settings, phases[2])
    stack.start_another("orchestrator", "orchestrator-b", new_env)
    await _group_is(settings, [0, partitions], 60)
    await _start_trips(settings, phases[3])
    saga_ids = [saga_id for phase in phases for saga_id in phase]

    ended = await terminal_events(settings, saga_ids, 90)
    otherwise = {saga_id: type(ended[saga_id]).__name__ if saga_id in ended else None for saga_id in saga_ids
                 if saga_id not in ended or type(ended[saga_id]).__name__ != "SagaCompleted"}
    assert not otherwise, (otherwise, await sagas_by_version(settings))
    statuses = await sagas_by_version(settings)
    assert set(statuses) <= {("COMPLETED", 1), ("COMPLETED", 2)}, statuses  # none quarantined
    versions = {saga_id: event.definition_version for saga_id, event in ended.items()}
    assert {versions[saga_id] for saga_id in phases[1] + phases[3]} == {2}, versions  # started while B held all
    assert {versions[saga_id] for saga_id in phases[0]} == {1}, versions  # before B came (those of the third phase
    # start on whichever holds the partitions when their StartSaga is read: A, or B back already)
    assert Counter(versions.values()) == {version: n for (_status, version), n in statuses.items()}
    assert "SagaQuarantined" not in stack.log("orchestrator") + stack.log("orchestrator-b")
    assert "ServedElsewhere" in stack.log("orchestrator")  # A did meet v2 trips while B was away, and waited
