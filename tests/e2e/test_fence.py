"""The turn-back fence through the real services: once a saga turns back (an operator's ForceCompensate, a cancel)
or skips a step, a forward command queued for a participant that was down does not run when it comes back; a step
waiting for a person's answer is withdrawn at once, and a late answer is refused; a FAILED saga may be terminated.

One deployment (``FENCE``, below) runs the trip, the shop's patient checkout (a skippable confirmation) and courier
checkout (a courier that fails for good after the pivot), and a checkout whose approval, before its pivot, waits
for a person. Its notification and mail participants run in workers of their own, to be stopped alone.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from examples.shop.checkout import (
    Order,
    authorise_payment,
    create_shipment,
    inventory,
    mail,
    payments,
    reserve_stock,
    shipping,
)
from saga_orchestrator.authoring import Deferred, Saga, SagaApp, StepContext, participant
from saga_orchestrator.cli.demo_cmd import DEMO_TIMEOUT_S
from saga_orchestrator.client import SagaClient
from saga_orchestrator.client.saga_client import SagaHandle
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.participants.kit.effects import count_effects
from saga_orchestrator.participants.runner import app_id
from saga_orchestrator.participants.trip import TRIP
from saga_orchestrator.participants.trip import app as trip_app
from saga_orchestrator.participants.trip.records import TripRequest
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import (
    Event,
    SagaCancelled,
    SagaCompensated,
    SagaCompleted,
    SagaFailed,
    SagaTerminated,
    StepCommandSent,
)
from saga_orchestrator.schemas.topics import Topics
from tests.chaos.crash_tools import restart, started_and_ready
from tests.chaos.tools.kafka_tools import wait_caught_up
from tests.conftest import module_stack
from tests.e2e.apps import courier, order, patient, redrivable
from tests.e2e.harness import Stack, run_refused, saga_cli, wait_for

pytestmark = pytest.mark.e2e

# A person approves each order of a held checkout (`saga answer desk KEY`) before its shipment, the pivot: a
# cancel is still accepted while the approval waits.
desk = participant("desk")


@desk.action
async def approve(step: StepContext, order: Order) -> Deferred:
    return Deferred()


held = Saga("held_checkout", input=Order, namespace="saga.v1.checkout")
_stock = held.step(reserve_stock)
_payment = held.step(authorise_payment)
_approval = held.step(approve, after=[_stock, _payment], timeout=timedelta(minutes=10))
held.step(create_shipment, after=[_approval], pivot=True)

FENCE = SagaApp(sagas=[TRIP, patient, redrivable, held],
                participants=[*(trip_app.participant(name) for name in trip_app.participant_names()),
                              inventory, payments, shipping, mail, courier, desk],
                schema_folder=Path(__file__).resolve().parents[2] / "examples" / "shop" / "schemas")
"""The trip, the patient and the courier checkouts, and the held checkout, in one deployment. The trip comes as
its engine definition and built participants, whose records are read from the trip's own schema folder (on
SAGA_SCHEMA_PATH after the app's): an app keeps the records of its typed parts in its one schema folder."""

PARTICIPANTS = [FENCE.participant(name) for name in FENCE.participant_names()]

# Notification, mail and courier alone in a worker each (stopped alone); every other participant in one more.
WORKERS = "notification,mail,courier,flight+hotel+payment+inventory+payments+shipping+desk"


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("logs")
    fence = settings.model_copy(update={"saga_app": "tests.e2e.test_fence:FENCE", "saga_participants": WORKERS})
    yield from module_stack(started_and_ready(fence, log_dir), log_dir)


@asynccontextmanager
async def _pool(stack: Stack) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(stack.settings.dsn(), min_size=1, max_size=1)
    try:
        yield pool
    finally:
        await pool.close()


async def _effects(stack: Stack, saga_id: str) -> dict[str, dict[str, int]]:
    """Each participant's effect counts for the saga (what `saga effects ID` and `saga verify` count)."""
    async with _pool(stack) as pool:
        return await count_effects(pool, PARTICIPANTS, saga_id)


async def _events(stack: Stack, saga_id: str) -> list[Event]:
    """The saga's recorded events, in order."""
    async with _pool(stack) as pool:
        rows = await pool.fetch("SELECT body FROM saga.events WHERE saga_id = $1 ORDER BY seq", saga_id)
    return [wire.decode_event(row["body"]) for row in rows]


def _of_step(events: list[Event], step: str) -> list[tuple[str, str | None]]:
    """(event, error type) of each of the events about ``step``."""
    return [(type(e).__name__, getattr(e, "error_type", None)) for e in events if getattr(e, "step", None) == step]


async def _ok(stack: Stack, *args: str) -> str:
    """`saga ARGS`, which must exit 0: what it printed."""
    done = await saga_cli(stack.settings, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def _history(stack: Stack, saga_id: str) -> list[dict[str, Any]]:
    """`saga history ID --json`: the saga's events as it prints them (one JSON object after the other)."""
    shown = (await _ok(stack, "history", saga_id, "--json")).strip()
    decoder, events, at = json.JSONDecoder(), [], 0
    while at < len(shown):
        event, at = decoder.raw_decode(shown, at)
        events.append(event)
        at += len(shown[at:]) - len(shown[at:].lstrip())
    return events


async def _reached(handle: SagaHandle, step: str) -> None:
    """Return once the saga sent its first command to ``step`` (AssertionError when it ends first)."""
    async for event in handle.events(timeout_s=DEMO_TIMEOUT_S):
        if isinstance(event, StepCommandSent) and event.step == step:
            return
    raise AssertionError(f"{handle.saga_id} ended before it sent {step}")


async def _caught_up(stack: Stack, participant_name: str) -> None:
    """Wait until the worker of ``participant_name`` read every command queued for it."""
    topics = Topics(stack.settings.saga_topic_prefix)
    group = app_id(participant_name, stack.settings)
    lagging = await wait_caught_up(stack.settings, {group: [topics.commands(participant_name)]}, 30)
    assert not lagging, f"{participant_name} did not read its backlog: {lagging}"


async def test_force_compensated_trips_send_no_itinerary_queued_while_notification_was_down(stack: Stack) -> None:
    stack.kill("notification")
    ids = [f"fence-fc-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    try:
        async with SagaClient.from_settings(stack.settings) as client:
            handles = [await client.start("trip", saga_id, TripRequest(**SCENARIOS["happy"].trip(saga_id)))
                       for saga_id in ids]
            for handle in handles:  # charged, and the itinerary's command waits on notification.commands
                await _reached(handle, "send_itinerary")
        for saga_id in ids:
            await _ok(stack, "force-compensate", saga_id, "--reason", "trip called off", "--operator", "uma")

        async def undone() -> bool:  # card refunded, bookings cancelled
            found = [await _effects(stack, saga_id) for saga_id in ids]
            return all((e["payment"]["refunded"], e["flight"]["cancelled"], e["hotel"]["cancelled"]) == (1, 1, 1)
                       for e in found)

        assert await wait_for(undone, 30, 0.3), [await _effects(stack, saga_id) for saga_id in ids]
        # Undone as far as it goes; whether the itinerary went out only notification can say: the saga waits.
        for saga_id in ids:
            events = await _events(stack, saga_id)
            assert not isinstance(events[-1], SagaCompensated), events[-1]
            assert _of_step(events, "send_itinerary")[-1] == ("StepWithdrawn", None), events
    finally:
        await restart(stack, "notification")
    async with SagaClient.from_settings(stack.settings) as client:
        ended = [await client.handle(saga_id).result(timeout_s=DEMO_TIMEOUT_S) for saga_id in ids]
    assert [(type(e).__name__, getattr(e, "reason", None)) for e in ended] == [
        ("SagaCompensated", "forced by an operator: trip called off")] * 3, ended
    await _caught_up(stack, "notification")
    for saga_id in ids:
        effects = await _effects(stack, saga_id)
        assert effects["notification"] == {"sent": 0}, (saga_id, effects)  # no itinerary went out
        assert (effects["payment"], effects["flight"], effects["hotel"]) == (
            {"charged": 1, "refunded": 1}, {"booked": 1, "cancelled": 1}, {"booked": 1, "cancelled": 1}), effects
        # The command had not run: refused as withdrawn (or as expired, picked up after its attempt's timeout).
        answered = _of_step(await _events(stack, saga_id), "send_itinerary")
        assert answered[-1] in (("StepFailed", "Withdrawn"), ("StepFailed", "Expired")), answered
        assert ("StepSucceeded", None) not in answered, answered
    verified = await saga_cli(stack.settings, "verify", *ids)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_commands_withdrawn_while_their_participant_was_down_do_not_run_when_it_is_back(
        stack: Stack) -> None:
    # The courier's step waits 10 minutes for an answer: back within seconds, the courier picks its commands up
    # before they expire, and only their withdrawals, queued behind them, keep them from running.
    stack.kill("courier")
    ids = [f"fence-late-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    try:
        async with SagaClient.from_settings(stack.settings) as client:
            handles = [await client.start("courier_checkout", saga_id, order(saga_id)) for saga_id in ids]
            for handle in handles:
                await _reached(handle, "book_courier")
        for saga_id in ids:
            await _ok(stack, "force-compensate", saga_id, "--reason", "order withdrawn", "--operator", "zed")
        for saga_id in ids:  # each withdrawal recorded
            assert await wait_for(lambda s=saga_id: _withdrawn(stack, s, "book_courier"), 30, 0.2), saga_id
        # ... and queued behind its command: recorded is not yet relayed. Had the courier come back first, it
        # would have read the command alone, run it, and answered the withdrawal that came later with its
        # success (a booking without undo after the turn-back: FAILED, rightly).
        assert await wait_for(lambda: _relayed(stack, "courier", ids), 30, 0.2), "withdrawals not relayed"
    finally:
        await restart(stack, "courier")
    async with SagaClient.from_settings(stack.settings) as client:
        ended = [await client.handle(saga_id).result(timeout_s=DEMO_TIMEOUT_S) for saga_id in ids]
    assert [type(e).__name__ for e in ended] == ["SagaCompensated"] * 3, ended
    for saga_id in ids:
        effects = await _effects(stack, saga_id)
        assert effects["courier"] == {"done": 0, "undone": 0}, (saga_id, effects)  # no courier booked
        answered = _of_step(await _events(stack, saga_id), "book_courier")
        assert answered[-1] == ("StepFailed", "Withdrawn") and ("StepSucceeded", None) not in answered, answered
    verified = await saga_cli(stack.settings, "verify", *ids)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def _withdrawn(stack: Stack, saga_id: str, step: str) -> bool:
    return ("StepWithdrawn", None) in _of_step(await _events(stack, saga_id), step)


async def _relayed(stack: Stack, participant_name: str, saga_ids: list[str]) -> bool:
    """Whether the orchestrator's outbox published every message due for the participant about the sagas (a row
    goes once sent)."""
    topic = Topics(stack.settings.saga_topic_prefix).commands(participant_name)
    async with _pool(stack) as pool:
        return not await pool.fetchval(
            "SELECT count(*) FROM saga.outbox WHERE topic = $1 AND message_key = ANY($2::text[])"
            " AND available_at <= now()", topic, saga_ids)


async def test_a_skipped_confirmation_queued_while_mail_was_down_is_not_sent(stack: Stack) -> None:
    stack.kill("mail")
    saga_id = f"fence-skip-{uuid.uuid4().hex[:6]}"
    try:
        async with SagaClient.from_settings(stack.settings) as client:
            handle = await client.start("patient_checkout", saga_id, order(saga_id))
            await _reached(handle, "send_confirmation")  # its command waits on mail.commands
            await _ok(stack, "skip", saga_id, "send_confirmation", "--reason", "told by phone", "--operator", "vic")
            ended = await handle.result(timeout_s=DEMO_TIMEOUT_S)
        assert isinstance(ended, SagaCompleted), ended
    finally:
        await restart(stack, "mail")
    await _caught_up(stack, "mail")
    effects = await _effects(stack, saga_id)
    assert effects["mail"] == {"done": 0, "undone": 0}, effects  # the skipped confirmation was not sent
    assert (effects["inventory"], effects["payments"], effects["shipping"]) == (
        {"done": 1, "undone": 0}, {"done": 1, "undone": 0}, {"done": 1, "undone": 0}), effects
    # Skipped, and its command withdrawn (a timeout may have come first); it never answered anything else.
    recorded = [found for found in _of_step(await _events(stack, saga_id), "send_confirmation")
                if found[0] != "StepTimedOut"]
    assert recorded == [("StepCommandSent", None), ("StepSkipped", None), ("StepWithdrawn", None)], recorded
    verified = await saga_cli(stack.settings, "verify", saga_id)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_a_cancel_withdraws_a_wait_for_a_person_and_a_late_answer_is_refused(stack: Stack) -> None:
    saga_id = f"fence-held-{uuid.uuid4().hex[:6]}"
    key = f"{saga_id}:approve"

    async def awaiting() -> list[str]:
        shown = await _ok(stack, "awaiting", "desk", "--saga", saga_id, "--json")
        return [json.loads(line)["idempotency_key"] for line in shown.splitlines() if line.strip()]

    async def waits() -> bool:
        return await awaiting() == [key]

    async with SagaClient.from_settings(stack.settings) as client:
        handle = await client.start("held_checkout", saga_id, order(saga_id))
        assert await wait_for(waits, DEMO_TIMEOUT_S, 0.3), "the desk did not defer"
        asked = time.monotonic()
        await client.cancel(saga_id, "customer changed their mind", operator="wes")
        ended = await handle.result(timeout_s=DEMO_TIMEOUT_S)
        took = time.monotonic() - asked
    assert isinstance(ended, SagaCancelled) and ended.reason == "customer changed their mind", ended
    assert took < 5, f"cancelled {took:.1f} s after the cancel was sent"  # not after the approval's 10 minutes
    assert await awaiting() == []
    line = await asyncio.to_thread(run_refused, stack.settings, "answer", "desk", key, "--output", "",
                                   "--operator", "xan")
    assert f"{key} was withdrawn at " in line and "its saga turned back" in line, line
    effects = await _effects(stack, saga_id)
    assert (effects["inventory"], effects["payments"], effects["shipping"]) == (
        {"done": 1, "undone": 1}, {"done": 1, "undone": 1}, {"done": 0, "undone": 0}), effects
    events = await _events(stack, saga_id)
    assert [getattr(e, "operator", None) for e in events if type(e).__name__ == "SagaCancelRequested"] == ["wes"]
    assert _of_step(events, "approve") == [
        ("StepCommandSent", None), ("StepWithdrawn", None), ("StepFailed", "Withdrawn")]
    verified = await saga_cli(stack.settings, "verify", saga_id)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_terminate_ends_a_failed_saga_with_who_and_why_in_its_history(stack: Stack) -> None:
    saga_id = f"fence-term-{uuid.uuid4().hex[:6]}"
    async with SagaClient.from_settings(stack.settings) as client:
        # No courier serves the address (for good) after the shipment, the pivot: the saga ends FAILED.
        failed = await (await client.start("courier_checkout", saga_id, order(saga_id, "unmapped"))).result(
            timeout_s=DEMO_TIMEOUT_S)
        assert isinstance(failed, SagaFailed) and failed.failed_step == "book_courier", failed
        later = client.handle(saga_id, since_ms=int(time.time() * 1000))
        await _ok(stack, "terminate", saga_id, "--reason", "courier booked by hand", "--operator", "yara")
        ended = await later.result(timeout_s=DEMO_TIMEOUT_S)
    assert isinstance(ended, SagaTerminated) and ended.reason == "courier booked by hand", ended
    events = await _history(stack, saga_id)
    assert [(e["event"], e.get("action"), e.get("operator"), e.get("detail"), e.get("reason"))
            for e in events[-2:]] == [("OperatorAction", "Terminate", "yara", "courier booked by hand", None),
                                      ("SagaTerminated", None, None, None, "courier booked by hand")], events[-3:]
    assert events[-3]["event"] == "SagaFailed", events[-3]
    verified = await saga_cli(stack.settings, "verify", saga_id)
    assert verified.returncode == 0, verified.stdout + verified.stderr
