"""A rolling deploy of a new trip version, against real orchestrators on Kafka and Postgres: orchestrator A serves
trip v1 only, B serves v1 and v2 and starts new trips on v2. While trips start, B joins, leaves and joins again,
and the partitions move each time: the group gives them only to the member serving every version, and A, holding
them while B is away, waits for it rather than quarantine the v2 trips. None is quarantined, all complete.

The same for a patch marker: B serves trip v1 with the fraud check behind a marker, so its new trips start on the
patched shape. Both serve v1, but B serves every shape A does and one more: it takes every partition, and A waits
for it rather than quarantine the trips on the patched shape."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import asyncpg
import pytest

from bench.trip_changes import FRAUD_CHECKED
from saga_orchestrator.infra.kafka_admin import group_members
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.participants.trip import TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.topics import Topics
from tests.chaos.crash_tools import wait_until_ready
from tests.e2e.harness import Stack, publish, sagas_by_version, terminal_events

pytestmark = pytest.mark.e2e

OLD = "saga_orchestrator.participants.trip:TRIP"
NEW = f"{OLD},bench.trip_changes:FLIGHT_ONLY"
PATCHED = "bench.trip_changes:FRAUD_CHECKED"
WORKER = "flight+hotel+payment+notification"
PER_PHASE = 10  # trips started in each of the four phases
EVERY_S = 0.1


@pytest.fixture(scope="module")
def rolling_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"saga_participants": WORKER, "saga_definitions": OLD})


@pytest.fixture
def stack(rolling_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack per test (each starts from A alone); the topics, the group and the database are the module's."""
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


async def _a_alone(stack: Stack, settings: Settings, phases: str) -> list[list[str]]:
    """A started alone, holding every partition; the saga ids of each of ``phases``."""
    stack.start("orchestrator", WORKER)
    await wait_until_ready(stack, ["orchestrator", WORKER])
    await _group_is(settings, [settings.saga_topic_partitions])
    return [[f"rolling-{phase}{index:02d}-{uuid.uuid4().hex[:6]}" for index in range(PER_PHASE)]
            for phase in phases]


async def _b_restarts(stack: Stack, settings: Settings, env: dict[str, str], while_away: list[str]) -> None:
    """B leaves: A holds the partitions meanwhile, and the replies of B's trips reach it (it waits for B), and the
    trips ``while_away`` start; then B comes back, taking every partition again."""
    leaving = stack.processes["orchestrator-b"]
    leaving.terminate()
    await asyncio.to_thread(leaving.wait, 30)
    await _group_is(settings, [settings.saga_topic_partitions], 60)
    await _start_trips(settings, while_away)
    stack.start_another("orchestrator", "orchestrator-b", env)
    await _group_is(settings, [0, settings.saga_topic_partitions], 60)


async def _all_completed(stack: Stack, settings: Settings, saga_ids: list[str]) -> dict[str, ev.Event]:
    """Each saga's terminal event, once every one completed; none was quarantined, and A waited for B."""
    ended = await terminal_events(settings, saga_ids, 90)
    otherwise = {saga_id: type(ended[saga_id]).__name__ if saga_id in ended else None for saga_id in saga_ids
                 if saga_id not in ended or type(ended[saga_id]).__name__ != "SagaCompleted"}
    assert not otherwise, (otherwise, await sagas_by_version(settings))
    assert "SagaQuarantined" not in stack.log("orchestrator") + stack.log("orchestrator-b")
    assert "ServedElsewhere" in stack.log("orchestrator")  # A did meet B's trips while B was away, and waited
    return ended


async def test_a_rolling_deploy_quarantines_no_trip_while_the_new_instance_comes_and_goes(
        stack: Stack, rolling_settings: Settings) -> None:
    settings = rolling_settings
    partitions = settings.saga_topic_partitions
    phases = await _a_alone(stack, settings, "abcd")
    new_env = {"SAGA_DEFINITIONS": NEW}
    # A alone: trips start on v1.
    await _start_trips(settings, phases[0])
    # B joins: it serves more, so it takes every partition and A none; trips start on v2 (its latest), their
    # charge answering slowly, so that they are still running when B goes.
    stack.start_another("orchestrator", "orchestrator-b", new_env)
    await _group_is(settings, [0, partitions], 60)
    await _start_trips(settings, phases[1], "card_slow")
    # B restarts: A holds the partitions meanwhile, and the v2 trips' replies reach it; it waits for B.
    await _b_restarts(stack, settings, new_env, phases[2])
    await _start_trips(settings, phases[3])
    saga_ids = [saga_id for phase in phases for saga_id in phase]

    ended = await _all_completed(stack, settings, saga_ids)
    statuses = await sagas_by_version(settings)
    assert set(statuses) <= {("COMPLETED", 1), ("COMPLETED", 2)}, statuses  # none quarantined
    versions = {saga_id: event.definition_version for saga_id, event in ended.items()}
    assert {versions[saga_id] for saga_id in phases[1] + phases[3]} == {2}, versions  # started while B held all
    assert {versions[saga_id] for saga_id in phases[0]} == {1}, versions  # before B came (those of the third phase
    # start on whichever holds the partitions when their StartSaga is read: A, or B back already)
    assert Counter(versions.values()) == {version: n for (_status, version), n in statuses.items()}


async def _started_shapes(settings: Settings, saga_ids: list[str]) -> dict[str, str | None]:
    """The shape each saga started on (its SagaStarted's fingerprint)."""
    conn = await asyncpg.connect(settings.dsn())
    try:
        rows = await conn.fetch("SELECT body FROM saga.events WHERE saga_id = ANY($1) AND seq = 1", saga_ids)
    finally:
        await conn.close()
    started = [wire.decode_event(row["body"]) for row in rows]
    return {event.saga_id: event.definition_fingerprint for event in started if isinstance(event, ev.SagaStarted)}


async def test_a_patch_marker_deployed_by_a_rolling_deploy_quarantines_no_trip(
        stack: Stack, rolling_settings: Settings) -> None:
    settings = rolling_settings
    phases = await _a_alone(stack, settings, "efgh")
    patched_env = {"SAGA_DEFINITIONS": PATCHED}
    # A alone: trips start on the released shape.
    await _start_trips(settings, phases[0])
    # B joins with v1 patched: one shape more, so it takes every partition; its trips start on the patched shape,
    # their charge answering slowly, so that they still run while B restarts and A meets their replies.
    stack.start_another("orchestrator", "orchestrator-b", patched_env)
    await _group_is(settings, [0, settings.saga_topic_partitions], 60)
    await _start_trips(settings, phases[1], "card_slow")
    await _b_restarts(stack, settings, patched_env, phases[2])
    await _start_trips(settings, phases[3])

    await _all_completed(stack, settings, [saga_id for phase in phases for saga_id in phase])
    shapes = await _started_shapes(settings, [saga_id for phase in phases for saga_id in phase])
    assert {shapes[saga_id] for saga_id in phases[0]} == {TRIP.fingerprint}, shapes
    assert {shapes[saga_id] for saga_id in phases[1] + phases[3]} == {FRAUD_CHECKED.fingerprint}, shapes
