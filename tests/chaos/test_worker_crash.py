"""A flight command that reaches a worker later than its step's timeout (2 s, the trip's own) is answered Expired,
not run, and sent again at once without spending an attempt; a step timeout waits for the answer instead of
retrying. So a healthy trip completes through a slow participant restart and through a worker killed -9 from
outside, whose partitions its group keeps for its 10 s session before the other worker takes them over.

- a slow restart: flight is stopped, trips start, every flight step times out, flight comes back; each trip's
  first flight attempt is answered Expired, the second books the flight, the trip completes;
- two flight workers share a paced run of a few hundred trips and one is killed with SIGKILL mid-run: the
  commands that wait on its partitions time out and are answered Expired by the survivor, every trip completes.

Both check with ``verify_system`` (every saga terminal, every effect once) and against the scenario's effects.
One stack serves the module, so tests run in file order.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Collection, Iterator
from pathlib import Path

import asyncpg
import pytest

from bench.chaos_support import publish_paced
from saga_orchestrator.infra.kafka_admin import settled_group
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.verify import verify_system
from saga_orchestrator.orchestrator.domain.model import EXPIRED_ERROR
from saga_orchestrator.orchestrator.domain.state import fold
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import (
    Event,
    SagaCompleted,
    StepCommandSent,
    StepFailed,
    StepSucceeded,
    StepTimedOut,
)
from tests.chaos.crash_tools import (
    DISARMED,
    SagaWatch,
    describe,
    ensure_running,
    scenario_problems,
    started_and_warm,
    wait_until_ready,
)
from tests.conftest import module_stack
from tests.e2e.harness import Stack

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

FLIGHT = "book_flight"
LAG_SAGAS = 40
KILL_SAGAS = 300
RATE = 20.0  # trips a second: 15 s of publishing
KILL_AT_S = 4.0  # after the first StartSaga; publishing goes on for 11 s more, past the dead worker's 10 s session
SETTLE_S = 60.0


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("worker-crash-logs")
    yield from module_stack(started_and_warm(settings, log_dir), log_dir)


@pytest.fixture
async def live(stack: Stack) -> Stack:
    """The module's stack with every service running (a failed test may have left one down)."""
    await ensure_running(stack)
    return stack


async def _stop(stack: Stack, name: str) -> None:
    """Stop one process gracefully (it leaves its consumer group at once)."""
    process = stack.processes[name]
    if process.poll() is None:
        process.terminate()
        await asyncio.to_thread(process.wait, 30)


async def _histories(settings: Settings, saga_ids: Collection[str]) -> dict[str, list[Event]]:
    """Each saga's events, in order, from the event store."""
    conn = await asyncpg.connect(settings.dsn())
    try:
        rows = await conn.fetch("SELECT saga_id, body FROM saga.events WHERE saga_id = ANY($1) ORDER BY saga_id, seq",
                                list(saga_ids))
    finally:
        await conn.close()
    histories: dict[str, list[Event]] = {}
    for row in rows:
        histories.setdefault(row["saga_id"], []).append(wire.decode_event(row["body"]))
    return histories


def _expired(history: list[Event]) -> list[StepFailed]:
    """The flight step's Expired answers."""
    return [e for e in history if isinstance(e, StepFailed) and e.step == FLIGHT and e.error_type == EXPIRED_ERROR]


def _timed_out(history: list[Event]) -> list[StepTimedOut]:
    return [e for e in history if isinstance(e, StepTimedOut) and e.step == FLIGHT]


def _resent_at_once(history: list[Event]) -> list[str]:
    """Problems with how the Expired answers of ``history`` were taken: each must be followed, in the same
    decision, by the flight step's next attempt (no backoff, no retry timer)."""
    problems = []
    for index, event in enumerate(history):
        if isinstance(event, StepFailed) and event.step == FLIGHT and event.error_type == EXPIRED_ERROR:
            following = history[index + 1] if index + 1 < len(history) else None
            if not (isinstance(following, StepCommandSent) and following.step == FLIGHT
                    and following.attempt == event.attempt + 1):
                problems.append(f"Expired attempt {event.attempt} followed by {following!r}")
    return problems


async def _effect_problems(settings: Settings, planned: dict[str, str], ended: dict[str, str]) -> dict[str, list[str]]:
    pool = await asyncpg.create_pool(settings.dsn(), min_size=1, max_size=2)
    try:
        return await scenario_problems(pool, planned, ended)
    finally:
        await pool.close()


async def test_commands_that_reach_a_slowly_restarted_participant_late_expire_and_go_again(live: Stack) -> None:
    settings = live.settings
    for name in [n for n in live.processes if n == "flight" or n.startswith("flight-")]:
        await _stop(live, name)
    planned = {f"lag-{uuid.uuid4().hex[:6]}-{n:02d}": "happy" for n in range(LAG_SAGAS)}
    async with SagaWatch(live) as watch:
        await watch.start(planned)
        # Every flight command is past its expires_at (its step timed out) before a flight worker is back.
        for saga_id in planned:
            await watch.wait_for(saga_id, "StepTimedOut", 30, step=FLIGHT)
        offset = len(live.log("flight"))
        live.start("flight", extra_env=DISARMED)
        await wait_until_ready(live, ["flight"], since={"flight": offset})
        ended = await watch.ended(planned, SETTLE_S)
    assert Counter(ended.values()) == Counter({"SagaCompleted": LAG_SAGAS}), Counter(ended.values())
    report = await verify_system(settings, list(planned), wait_s=15)
    assert report.ok, describe(report)
    assert await _effect_problems(settings, planned, ended) == {}  # one flight, hotel, charge and itinerary each

    histories = await _histories(settings, planned)
    wrong: dict[str, object] = {}
    for saga_id in planned:
        history = histories[saga_id]
        expired = _expired(history)
        succeeded = [e for e in history if isinstance(e, StepSucceeded) and e.step == FLIGHT]
        flight = fold(TRIP, history).steps[FLIGHT]
        problems = _resent_at_once(history)
        if [e.attempt for e in _timed_out(history)][:1] != [1]:
            problems.append("attempt 1 did not time out")
        if [e.attempt for e in expired][:1] != [1]:
            problems.append(f"attempt 1 was not answered Expired: {[(e.attempt, e.error_type) for e in expired]}")
        if len(succeeded) != 1 or succeeded[0].attempt < 2:
            problems.append(f"flight booked by attempts {[e.attempt for e in succeeded]}, expected one later than 1")
        if flight.unspent != len(expired) or flight.spent != 1:  # only the attempt that ran counts
            problems.append(f"attempts {flight.attempt}, unspent {flight.unspent}, spent {flight.spent}")
        if not isinstance(history[-1], SagaCompleted):
            problems.append(f"ends with {type(history[-1]).__name__}")
        if problems:
            wrong[saga_id] = (problems, [type(e).__name__ + f":{getattr(e, 'step', '')}" for e in history])
    assert not wrong, list(wrong.items())[:3]
    assert live.log("flight")[offset:].count('"msg":"command expired"') >= LAG_SAGAS
    assert not live.exited(), live.exited()


async def test_a_flight_worker_killed_with_sigkill_mid_run_leaves_every_trip_to_complete(live: Stack) -> None:
    settings = live.settings
    group = f"{settings.saga_topic_prefix}saga-participant-flight"
    live.start_another("flight", "flight-2", DISARMED)
    shared = await settled_group(settings.kafka(), group, members=2)
    assert shared[0].isdisjoint(shared[1]) and shared[0] | shared[1] == set(range(settings.saga_topic_partitions))

    planned = {f"kill9-{uuid.uuid4().hex[:6]}-{n:03d}": "happy" for n in range(KILL_SAGAS)}
    starts = {saga_id: wire.encode_start(SCENARIOS[name].start(saga_id)) for saga_id, name in planned.items()}
    async with SagaWatch(live) as watch:
        started = time.monotonic()
        publishing = asyncio.create_task(publish_paced(settings, starts, RATE))
        await asyncio.sleep(KILL_AT_S)
        live.kill("flight")  # kill -9 from outside, whatever it was doing
        await publishing
        published_s = time.monotonic() - started
        ended = await watch.ended(planned, SETTLE_S)
    outcomes = Counter(ended.values())
    histories = await _histories(settings, planned)
    timed_out = sum(1 for history in histories.values() if _timed_out(history))
    expired = sum(len(_expired(history)) for history in histories.values())
    print(f"{KILL_SAGAS} trips in {published_s:.1f} s, flight worker killed at {KILL_AT_S} s: {dict(outcomes)}; "
          f"{timed_out} flight steps timed out, {expired} flight commands answered Expired")
    assert outcomes == Counter({"SagaCompleted": KILL_SAGAS}), outcomes
    report = await verify_system(settings, list(planned), wait_s=15)
    assert report.ok, describe(report)  # every effect once, nothing missing
    assert await _effect_problems(settings, planned, ended) == {}
    assert live.processes["flight"].poll() == -9
    assert live.processes["flight-2"].poll() is None
    # Trips kept coming for longer than the dead worker's session: the commands that waited on its partitions
    # timed out, and the survivor answered them Expired when it took the partitions over.
    assert timed_out > 0 and expired > 0, (timed_out, expired)
    wrong = {saga_id: problems for saga_id, history in histories.items() if (problems := _resent_at_once(history))}
    assert not wrong, list(wrong.items())[:3]
    assert await settled_group(settings.kafka(), group, members=1) == [set(range(settings.saga_topic_partitions))]
