"""kill -9 of services mid-run — at the most dangerous instants, around durable timers, at random — and recovery.

Crash points (``infra/faults.py``, armed through SAGA_FAULTS in one service's environment):

- orchestrator.after_commit: its Postgres transactions committed, its Kafka offsets not → the batch is
  consumed again and the inbox must make that harmless;
- relay.after_publish: Kafka acknowledged the batch, the outbox rows are not deleted → published twice,
  consumers dedupe by message id;
- participant.after_commit (notification): the itinerary and its reply row committed, the reply not
  published and the command not acknowledged → the command is redelivered and must get the recorded reply,
  not a second itinerary.

The armed participant is notification because its step is retried without limit: a participant killed with
-9 is away for about its consumer-group session timeout (10 s), close to the payment step's whole retry
budget (about 13 s) and above the booking steps', so killing one of those at an arbitrary moment can change
a saga's outcome (a correct compensation, but not the scenario's). The payment participant is killed in the
timer test below (timed so the budget holds) and may be hit by the random kills.

Every test checks with ``verify_system``: each saga terminal, its effects as its end says, no double effect,
the read model equal to the fold. One stack serves the whole module, so tests run in file order.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.verify import verify_system
from saga_orchestrator.orchestrator.audit import audit_all
from saga_orchestrator.participants.trip.effects import collect_effects
from saga_orchestrator.participants.trip.scenarios import COMPLETED_EFFECTS, mismatches, observed
from saga_orchestrator.schemas.event_types import StepCommandSent, StepRetryScheduled
from tests.chaos.crash_tools import (
    CRASH_MIX,
    DISARMED,
    SagaWatch,
    armed,
    describe,
    ensure_running,
    killed_by_its_crash_point,
    logged_within,
    plan,
    restart,
    started_and_warm,
    unexpected_endings,
    wait_for_exit,
)
from tests.conftest import module_stack
from tests.e2e.harness import Stack

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

NTH_HIT = 5  # mid-run: the first sagas are under way, the last ones not finished
SETTLE_S = 90.0


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("logs")
    yield from module_stack(started_and_warm(settings, log_dir), log_dir)


@pytest.fixture
async def live(stack: Stack) -> Stack:
    """The module's stack with every service running (a failed test may have left one down)."""
    await ensure_running(stack)
    return stack


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.mark.parametrize(("label", "point"), [
    ("orchestrator", "orchestrator.after_commit"),
    ("orchestrator", "relay.after_publish"),  # the relay runs inside the orchestrator (saga run all)
    ("notification", "participant.after_commit"),
])
async def test_kill_at_a_crash_point_then_restart(live: Stack, label: str, point: str) -> None:
    await restart(live, label, armed(point, NTH_HIT))
    planned = plan(f"crash-{label}-{uuid.uuid4().hex[:6]}", CRASH_MIX)
    async with SagaWatch(live) as watch:
        await watch.start(planned)
        code = await wait_for_exit(live, label, timeout_s=60)
        problem = killed_by_its_crash_point(live, label, point, code)
        assert problem is None, problem
        live.start(label, extra_env=DISARMED)
        ended = await watch.ended(planned, SETTLE_S)
        duplicates = watch.feed.duplicates
    assert unexpected_endings(planned, ended) == []
    report = await verify_system(live.settings, planned, wait_s=15)
    assert report.ok, describe(report)
    assert report.started == len(planned)
    assert not live.exited(), f"services exited: {live.exited()}"
    if point == "relay.after_publish":
        assert duplicates > 0, "the acknowledged batch must have been published again"
    if label == "notification":
        # The commands of the batch committed but not acknowledged come again: each is handled once more (a
        # duplicate answered from its record; one whose outcome was not recorded, a transient failure, runs
        # again or, picked up past its attempt's time, is answered Expired). The replies committed before the
        # kill are relayed as soon as the new worker starts and may end the sagas before that worker reads the
        # redelivered commands: give it the time to read them.
        log = live.log(label)
        kill_line = next(line for line in log.splitlines() if f"kill -9 at crash point {point}" in line)
        after = log.index(kill_line) + len(kill_line)
        unacknowledged = json.loads(kill_line)["idempotency_keys"]
        assert unacknowledged, kill_line
        for key in unacknowledged:
            assert await logged_within(live, label, f'"idempotency_key":"{key}"', within_s=30, since=after), \
                f"the unacknowledged command {key} must come again"


async def _timers(settings: Settings, saga_id: str) -> list[tuple[str, str, int]]:
    conn = await asyncpg.connect(settings.dsn())
    try:
        rows = await conn.fetch("SELECT kind, step, attempt FROM saga.timers WHERE saga_id = $1", saga_id)
        return [(row["kind"], row["step"], row["attempt"]) for row in rows]
    finally:
        await conn.close()


async def test_a_timer_due_while_the_orchestrator_is_down_fires_after_it_comes_back(live: Stack) -> None:
    # email_bounce: sending fails (transiently) three times; the third failure schedules attempt 4 about
    # 800 ms later — a retry timer with nothing else pending, so only the timer can move the saga on.
    saga_id = f"timer-{uuid.uuid4().hex[:6]}"
    async with SagaWatch(live) as watch:
        await watch.start({saga_id: "email_bounce"})
        deadline = time.monotonic() + 30
        retry: StepRetryScheduled | None = None
        while retry is None and time.monotonic() < deadline:
            await watch.feed.poll(20)
            retry = next((e for e in watch.feed.history(saga_id) if isinstance(e, StepRetryScheduled)
                          and e.step == "send_itinerary" and e.attempt == 4), None)
        assert retry is not None, [type(e).__name__ for e in watch.feed.history(saga_id)]
        live.kill("orchestrator")
        assert _now_ms() < retry.due_at, "the orchestrator must be down before the timer is due"
        await asyncio.sleep((retry.due_at - _now_ms()) / 1000 + 0.5)
        pending = await _timers(live.settings, saga_id)
        assert ("STEP_RETRY", "send_itinerary", 4) in pending, f"the overdue timer must wait: {pending}"
        live.start("orchestrator", extra_env=DISARMED)
        restarted_at = _now_ms()
        ended = await watch.ended([saga_id], SETTLE_S)
        sent = [e for e in watch.feed.history(saga_id)
                if isinstance(e, StepCommandSent) and e.step == "send_itinerary" and e.attempt == 4]
    assert ended == {saga_id: "SagaCompleted"}
    assert len(sent) == 1 and sent[0].occurred_at >= restarted_at, "attempt 4 is sent by the restarted one"
    report = await verify_system(live.settings, [saga_id], wait_s=10)
    assert report.ok, describe(report)


async def test_a_step_that_timed_out_while_its_participant_was_down_is_retried_with_the_same_key(
        live: Stack) -> None:
    live.kill("payment")
    # The group drops the dead member only after its session timeout (10 s): starting the saga a little
    # later keeps the payment step's retry budget (about 13 s from the first attempt) clear of that wait.
    await asyncio.sleep(3)
    saga_id = f"payment-down-{uuid.uuid4().hex[:6]}"
    async with SagaWatch(live) as watch:
        await watch.start({saga_id: "happy"})
        await watch.wait_for(saga_id, "StepTimedOut", 30, step="charge_card")
        live.start("payment", extra_env=DISARMED)
        ended = await watch.ended([saga_id], SETTLE_S)
        history = watch.feed.history(saga_id)
    assert ended == {saga_id: "SagaCompleted"}
    charges = [e for e in history if isinstance(e, StepCommandSent) and e.step == "charge_card"]
    assert len(charges) >= 2, "the timed-out charge must be sent again"
    assert {e.idempotency_key for e in charges} == {f"{saga_id}:charge_card"}
    pool = await asyncpg.create_pool(live.settings.dsn(), min_size=1, max_size=2)
    try:
        assert mismatches(COMPLETED_EFFECTS, observed(await collect_effects(pool, saga_id))) == []
    finally:
        await pool.close()
    report = await verify_system(live.settings, [saga_id], wait_s=10)
    assert report.ok, describe(report)


async def test_random_kills_break_no_invariant(live: Stack) -> None:
    seed = int(os.environ.get("SAGA_CHAOS_SEED", random.randrange(1 << 32)))
    rng = random.Random(seed)
    print(f"random kills: SAGA_CHAOS_SEED={seed}")
    planned = plan(f"random-{uuid.uuid4().hex[:6]}", {name: count * 2 for name, count in CRASH_MIX.items()})
    kills: list[str] = []

    async def kill_at_random() -> None:
        for _ in range(rng.randint(3, 5)):
            await asyncio.sleep(rng.uniform(0.5, 2.5))
            victim = rng.choice(live.labels)
            live.kill(victim)
            kills.append(victim)
            await asyncio.sleep(rng.uniform(0.1, 1.0))
            live.start(victim, extra_env=DISARMED)

    async def publish_in_waves(watch: SagaWatch) -> None:
        items = sorted(planned.items(), key=lambda _: rng.random())
        for first in range(0, len(items), 6):
            await watch.start(dict(items[first:first + 6]))
            await asyncio.sleep(0.8)

    async with SagaWatch(live) as watch:
        await asyncio.gather(kill_at_random(), publish_in_waves(watch))
        ended = await watch.ended(planned, SETTLE_S)
    # A participant down for longer than a step's retry budget legitimately turns a success into a
    # compensation, so only the invariants are asserted here, not each scenario's outcome.
    print(f"killed {kills}; ended {Counter(ended.values())}")
    report = await verify_system(live.settings, planned, wait_s=20)
    assert report.ok, f"SAGA_CHAOS_SEED={seed}, kills {kills}\n{describe(report)}"
    assert report.started == len(planned)
    assert not live.exited(), f"services exited: {live.exited()}"


async def test_the_topic_and_the_store_agree_after_all_the_kills(stack: Stack) -> None:
    differences, _, figures = await audit_all(stack.settings)
    assert differences == [], differences[:5]
    assert figures["events on the topic"] == figures["events in the store"] > 0
