"""Two worker processes of one participant share its commands; one killed with -9 right after a batch committed
(before its offsets) leaves the other to take its partitions over: every saga ends, nothing is booked twice.

The trip's flight step times out after 2 s (its own timeout), while a dead member keeps its partitions for the
workers' session timeout (10 s): the orchestrator records StepTimedOut and waits for the answer. A command the dead
worker had handled gets its recorded reply again from the survivor (or from its outbox, relayed once the dead
worker's shard leases expire); one it had not is answered Expired by the survivor and sent again at once. So every
trip completes, and ``verify_system`` holds for every saga.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from saga_orchestrator.cli.demo_cmd import drive
from saga_orchestrator.infra.kafka_admin import settled_group
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.verify import verify_system
from saga_orchestrator.orchestrator.domain.model import EXPIRED_ERROR
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import StepFailed, StepTimedOut
from tests.conftest import module_stack
from tests.e2e.harness import Stack, start_stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
SAGAS = 300
WAVES = 5  # sagas start in waves, so that each worker handles several batches
KILLED_AFTER_COMMITS = 2  # the first worker's second transaction is its last: SIGKILL before its offsets


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("workers-logs")
    yield from module_stack(start_stack(settings, log_dir), log_dir)


async def test_two_workers_of_one_participant_and_one_killed_mid_batch(stack: Stack, tmp_path: Path) -> None:
    settings = stack.settings
    group = f"{settings.saga_topic_prefix}saga-participant-flight"
    # the first worker of flight dies on its KILLED_AFTER_COMMITS-th commit; the second stays
    stack.kill("flight")
    stack.start("flight", extra_env={"SAGA_FAULTS": f"participant.after_commit={KILLED_AFTER_COMMITS}"})
    stack.start_another("flight", "flight-2")
    second = stack.processes["flight-2"]
    shared = await settled_group(settings.kafka(), group, members=2)
    assert shared[0].isdisjoint(shared[1]) and shared[0] | shared[1] == set(range(settings.saga_topic_partitions))
    # each worker relays the replies of its own partitions: the outbox's shards leased as the partitions went
    assert sorted(await _leased_shards(settings, 2), key=min) == sorted(shared, key=min)

    run_id = uuid.uuid4().hex[:6]
    planned = {f"workers-{run_id}-{n:03d}": "happy" for n in range(SAGAS)}
    ended: dict[str, str] = {}
    wave = SAGAS // WAVES
    for first in range(0, SAGAS, wave):
        ended |= await drive(settings, dict(list(planned.items())[first:first + wave]), 240)
    assert set(ended) == set(planned)
    outcomes = Counter(ended.values())
    timed_out, expired = await _late_flight_answers(settings, list(planned))
    # How many flight commands waited on the dead worker depends on where its batch stood and how fast its relay
    # was (the replies it committed may reach Kafka before the kill, or only from the survivor): printed, not
    # asserted (tests/chaos/test_worker_crash.py asserts them for a worker killed while trips keep coming).
    print(f"outcomes with one of two flight workers killed: {dict(outcomes)}; {timed_out} flight steps timed out, "
          f"{expired} flight commands answered Expired")
    assert outcomes == Counter({"SagaCompleted": SAGAS}), outcomes  # healthy trips: none compensated
    assert stack.processes["flight"].poll() == -9  # it did die mid-run, by its own SIGKILL
    assert second.poll() is None
    report = await verify_system(settings, list(planned))
    assert report.ok, (report.not_terminal[:5], report.violations[:5])  # every effect once, nothing missing
    assert await settled_group(settings.kafka(), group, members=1) == [set(range(settings.saga_topic_partitions))]


async def _late_flight_answers(settings: Settings, saga_ids: list[str]) -> tuple[int, int]:
    """How many of the sagas' flight steps timed out, and how many flight commands were answered Expired."""
    conn = await asyncpg.connect(settings.dsn())
    try:
        events = [wire.decode_event(row["body"]) for row in await conn.fetch(
            "SELECT body FROM saga.events WHERE saga_id = ANY($1) AND event_type IN ('StepTimedOut', 'StepFailed')",
            saga_ids)]
    finally:
        await conn.close()
    flight = [e for e in events if getattr(e, "step", None) == "book_flight"]
    return (sum(1 for e in flight if isinstance(e, StepTimedOut)),
            sum(1 for e in flight if isinstance(e, StepFailed) and e.error_type == EXPIRED_ERROR))


async def _leased_shards(settings: Settings, holders: int, timeout_s: float = 15) -> list[set[int]]:
    """The shards of flight's outbox each live lease holder has, once there are ``holders`` of them."""
    conn = await asyncpg.connect(settings.dsn())
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            rows = await conn.fetch("SELECT array_agg(shard) AS shards FROM flight.outbox_leases"
                                    " WHERE expires_at > now() GROUP BY holder")
            found = [set(row["shards"]) for row in rows]
            if len(found) == holders or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.2)
    finally:
        await conn.close()
