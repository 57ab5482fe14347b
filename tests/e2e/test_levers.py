"""An operator's levers through the real services: RetryNow from the CLI and from the client, on a checkout whose
confirmation waits an hour between attempts, recorded with the operator and the reason; a lever that cannot
apply recorded as refused; Redrive of checkouts that failed for good after their pivot; who answered a deferred
command and who replayed a dead letter, in the saga's history; `saga audit` and `saga verify` agree afterwards."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.shop.checkout import Order
from saga_orchestrator.cli.demo_cmd import DEMO_TIMEOUT_S
from saga_orchestrator.client import SagaClient
from saga_orchestrator.client.saga_client import SagaHandle
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import (
    SagaCancelRefused,
    SagaCompensated,
    SagaCompleted,
    SagaFailed,
    StepRetryScheduled,
)
from saga_orchestrator.schemas.message_types import StartSaga
from saga_orchestrator.schemas.topics import Topics
from tests.chaos.crash_tools import started_and_ready
from tests.conftest import module_stack
from tests.e2e.harness import Stack, publish, saga_cli, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("logs")
    levers = settings.model_copy(update={"saga_app": "tests.e2e.apps:LEVERS", "saga_participants": ""})
    yield from module_stack(started_and_ready(levers, log_dir), log_dir)


async def _json_lines(stack: Stack, *args: str) -> list[dict[str, Any]]:
    """The JSON objects `saga ARGS` prints (pretty-printed, one after the other), in order."""
    shown = await saga_cli(stack.settings, *args)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    decoder, text, found, at = json.JSONDecoder(), shown.stdout, [], 0
    while (at := _skip_space(text, at)) < len(text):
        value, at = decoder.raw_decode(text, at)
        found.append(value)
    return found


async def _history(stack: Stack, saga_id: str) -> list[dict[str, Any]]:
    """`saga history ID --json`: its events, in order."""
    return await _json_lines(stack, "history", saga_id, "--json")


async def _history_until_refused(stack: Stack, saga_id: str) -> list[dict[str, Any]]:
    """The saga's history once it ends with the OperatorActionRefused the orchestrator records for a lever just
    published (it reads it a moment later), or as it stands after 10 s."""
    events = await _history(stack, saga_id)
    for _ in range(20):
        if events[-1]["event"] == "OperatorActionRefused":
            break
        await asyncio.sleep(0.5)
        events = await _history(stack, saga_id)
    return events


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


async def _waiting(client: SagaClient, prefix: str) -> tuple[str, SagaHandle]:
    """A checkout started whose confirmation (past the pivot) found the mailbox full and waits an hour to try
    again: its saga id and handle."""
    saga_id = f"{prefix}-{uuid.uuid4().hex[:6]}"
    order = Order(order_id=saga_id, sku="SKU-1", quantity=1, amount_cents=999, address="1 Main St",
                  email="full@bounce.test")  # the mailbox is full on the first two attempts
    handle = await client.start("patient_checkout", saga_id, order)
    scheduled = await _retry_scheduled(handle, 2)
    assert scheduled.step == "send_confirmation" and scheduled.due_at - scheduled.occurred_at >= 3_000_000
    return saga_id, handle


async def _retry_scheduled(handle: SagaHandle, attempt: int) -> StepRetryScheduled:
    async for event in handle.events(timeout_s=DEMO_TIMEOUT_S):
        if isinstance(event, StepRetryScheduled) and event.attempt == attempt:
            return event
    raise AssertionError(f"{handle.saga_id} ended before attempt {attempt} of a step was scheduled")


async def test_retry_now_from_the_cli_and_the_client_skips_the_hour(stack: Stack) -> None:
    async with SagaClient.from_settings(stack.settings) as client:
        saga_id, handle = await _waiting(client, "lever")

        pulled = await saga_cli(stack.settings, "retry-now", saga_id, "send_confirmation", "--operator", "alice",
                                "--reason", "mailbox emptied")
        assert pulled.returncode == 0, pulled.stdout + pulled.stderr
        await _retry_scheduled(handle, 3)  # attempt 2 ran at once, and found the mailbox full again

        await client.retry_now(saga_id, "send_confirmation", operator="bob", reason="asked the customer")
        ended = await handle.result(timeout_s=DEMO_TIMEOUT_S)
    assert isinstance(ended, SagaCompleted)

    refused = await saga_cli(stack.settings, "retry-now", saga_id, "send_confirmation", "--operator", "carol")
    assert refused.returncode == 0, refused.stdout + refused.stderr
    events = await _history_until_refused(stack, saga_id)
    levers = [(event["event"], event["operator"], event.get("detail") or event.get("reason"))
              for event in events if event["event"].startswith("OperatorAction")]
    assert levers == [("OperatorAction", "alice", "send_confirmation: mailbox emptied"),
                      ("OperatorAction", "bob", "send_confirmation: asked the customer"),
                      ("OperatorActionRefused", "carol", "saga is COMPLETED: nothing waits to be retried")], levers
    attempts = [event["attempt"] for event in events if event["event"] == "StepCommandSent"
                and event["step"] == "send_confirmation"]
    assert attempts == [1, 2, 3]  # each attempt once: the hourly timers that fire later change nothing

    audited = await saga_cli(stack.settings, "audit", timeout_s=120)
    assert audited.returncode == 0, audited.stdout + audited.stderr
    verified = await saga_cli(stack.settings, "verify", saga_id)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_terminate_from_the_cli_and_the_client_ends_sagas_as_they_stand(stack: Stack) -> None:
    async with SagaClient.from_settings(stack.settings) as client:
        waiting = [await _waiting(client, "term-cli"), await _waiting(client, "term-client")]
        ids, handles = [saga_id for saga_id, _ in waiting], [handle for _, handle in waiting]
        ended = await saga_cli(stack.settings, "terminate", ids[0], "--reason", "confirmed by phone",
                               "--operator", "dora")
        assert ended.returncode == 0, ended.stdout + ended.stderr
        await client.terminate(ids[1], "confirmed by post", operator="erin")
        results = [await handle.result(timeout_s=DEMO_TIMEOUT_S) for handle in handles]
    assert [type(result).__name__ for result in results] == ["SagaTerminated", "SagaTerminated"]
    assert [getattr(result, "reason", None) for result in results] == ["confirmed by phone", "confirmed by post"]
    for saga_id, operator in zip(ids, ("dora", "erin"), strict=True):
        events = await _history(stack, saga_id)
        assert [(e["event"], e.get("operator")) for e in events[-2:]] == [("OperatorAction", operator),
                                                                         ("SagaTerminated", None)]
        status = await saga_cli(stack.settings, "status", saga_id)
        assert status.returncode == 0 and "TERMINATED" in status.stdout, status.stdout + status.stderr
    audited = await saga_cli(stack.settings, "audit", timeout_s=120)
    assert audited.returncode == 0, audited.stdout + audited.stderr
    verified = await saga_cli(stack.settings, "verify", *ids)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_a_paused_saga_refuses_retry_now_and_unpause_sends_what_was_due(stack: Stack) -> None:
    async with SagaClient.from_settings(stack.settings) as client:
        saga_id, handle = await _waiting(client, "pause")
        paused = await saga_cli(stack.settings, "pause", saga_id, "--operator", "fay", "--reason", "carrier strike")
        assert paused.returncode == 0, paused.stdout + paused.stderr
        await client.retry_now(saga_id, "send_confirmation", operator="gus")  # refused: the saga is paused
        events = await _history_until_refused(stack, saga_id)
        assert [(e["event"], e["operator"]) for e in events[-2:]] == [("OperatorAction", "fay"),
                                                                     ("OperatorActionRefused", "gus")], events[-2:]
        assert events[-1]["reason"] == "saga is paused: unpause it, which sends what is open"

        await client.unpause(saga_id, operator="fay")  # attempt 2 was due: sent at once, and the mailbox is full
        await _retry_scheduled(handle, 3)
        await client.retry_now(saga_id, "send_confirmation", operator="fay")
        ended = await handle.result(timeout_s=DEMO_TIMEOUT_S)
    assert isinstance(ended, SagaCompleted)
    events = await _history(stack, saga_id)
    sent = [(e["event"], e.get("attempt")) for e in events
            if e["event"] == "StepCommandSent" and e["step"] == "send_confirmation"]
    assert sent == [("StepCommandSent", 1), ("StepCommandSent", 2), ("StepCommandSent", 3)]
    verified = await saga_cli(stack.settings, "verify", saga_id)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_skip_lets_a_saga_go_on_without_a_stuck_step(stack: Stack) -> None:
    async with SagaClient.from_settings(stack.settings) as client:
        saga_id, handle = await _waiting(client, "skip")
        skipped = await saga_cli(stack.settings, "skip", saga_id, "send_confirmation", "--reason", "sent by hand",
                                 "--operator", "hal")
        assert skipped.returncode == 0, skipped.stdout + skipped.stderr
        ended = await handle.result(timeout_s=DEMO_TIMEOUT_S)
    assert isinstance(ended, SagaCompleted)
    async with SagaClient.from_settings(stack.settings) as client:
        await client.skip(saga_id, "reserve_stock", "mistaken", operator="ivy")  # not skippable: refused
    events = await _history_until_refused(stack, saga_id)
    assert [(e["event"], e.get("step")) for e in events if e["event"] in ("OperatorAction", "StepSkipped")] == [
        ("OperatorAction", None), ("StepSkipped", "send_confirmation")]
    assert events[-1]["reason"].startswith("step reserve_stock is not skippable")
    verified = await saga_cli(stack.settings, "verify", saga_id)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_force_compensate_undoes_a_saga_past_its_pivot(stack: Stack) -> None:
    async with SagaClient.from_settings(stack.settings) as client:
        saga_id, handle = await _waiting(client, "force")
        forced = await saga_cli(stack.settings, "force-compensate", saga_id, "--reason", "order withdrawn",
                                "--operator", "jo")
        assert forced.returncode == 0, forced.stdout + forced.stderr
        ended = await handle.result(timeout_s=DEMO_TIMEOUT_S)
        assert isinstance(ended, SagaCompensated) and ended.reason == "forced by an operator: order withdrawn"
        await client.force_compensate(saga_id, "again", operator="kim")  # it ended COMPENSATED: refused
    events = await _history_until_refused(stack, saga_id)
    assert events[-1]["reason"].startswith("saga is COMPENSATED: only a RUNNING or FAILED saga"), events[-1]
    shown = await saga_cli(stack.settings, "effects", saga_id, "--json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    counts = {name: found["counts"] for name, found in json.loads(shown.stdout)["participants"].items()}
    assert counts == {"inventory": {"done": 1, "undone": 1}, "payments": {"done": 1, "undone": 1},
                      "shipping": {"done": 1, "undone": 0}, "mail": {"done": 0, "undone": 0},  # no undo to ship
                      "courier": {"done": 0, "undone": 0}}  # the app's other saga type books couriers
    verified = await saga_cli(stack.settings, "verify", saga_id)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_a_cancel_refused_after_the_pivot_records_who_asked(stack: Stack) -> None:
    async with SagaClient.from_settings(stack.settings) as client:
        saga_id, handle = await _waiting(client, "cancel")
        cancelled = await saga_cli(stack.settings, "cancel", saga_id, "--reason", "customer asked", "--operator",
                                   "lee")
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        refused = None
        async for event in handle.events(timeout_s=DEMO_TIMEOUT_S):
            if isinstance(event, SagaCancelRefused):
                refused = event
                break
    assert refused is not None and refused.operator == "lee"
    assert refused.reason == "pivot step create_shipment already succeeded; the saga only moves forward"


def _order(saga_id: str, address: str) -> Order:
    return Order(order_id=saga_id, sku="SKU-1", quantity=1, amount_cents=999, address=address, email="a@b.test")


async def _until(stack: Stack, saga_id: str, wanted: str, operator: str) -> list[dict[str, Any]]:
    """The saga's history once it holds an OperatorAction ``wanted`` by ``operator`` (AssertionError after 20 s)."""
    events: list[dict[str, Any]] = []

    async def recorded() -> bool:
        nonlocal events
        events = await _history(stack, saga_id)
        return any(e["event"] == "OperatorAction" and (e["action"], e["operator"]) == (wanted, operator)
                   for e in events)

    assert await wait_for(recorded, 20, 0.5), [(e["event"], e.get("action")) for e in events]
    return events


async def test_redrive_from_the_cli_and_the_client_completes_sagas_that_failed_after_their_pivot(
        stack: Stack) -> None:
    async with SagaClient.from_settings(stack.settings) as client:
        ids = [f"redrive-{way}-{uuid.uuid4().hex[:6]}" for way in ("cli", "client")]
        handles = [await client.start("courier_checkout", saga_id, _order(saga_id, "unmapped")) for saga_id in ids]
        failed = [await handle.result(timeout_s=DEMO_TIMEOUT_S) for handle in handles]
        assert [type(event).__name__ for event in failed] == ["SagaFailed", "SagaFailed"]
        assert all(isinstance(event, SagaFailed) and event.failed_step == "book_courier" for event in failed)
        now_ms = int(time.time() * 1000)  # after their SagaFailed was published: a handle of what comes next
        later = [client.handle(saga_id, since_ms=now_ms) for saga_id in ids]

        refused = await saga_cli(stack.settings, "redrive", ids[0], "--reason", "map fixed", "--operator", "mo",
                                 "--force")  # published: the orchestrator decides
        assert refused.returncode == 0, refused.stdout + refused.stderr
        await client.redrive(ids[1], "map fixed", operator="ned")
        ended = [await handle.result(timeout_s=DEMO_TIMEOUT_S) for handle in later]
    assert [type(event).__name__ for event in ended] == ["SagaCompleted", "SagaCompleted"]
    for saga_id, operator in zip(ids, ("mo", "ned"), strict=True):
        events = await _history(stack, saga_id)
        redrives = [(e["operator"], e["detail"]) for e in events
                    if e["event"] == "OperatorAction" and e["action"] == "Redrive"]
        assert redrives == [(operator, "map fixed")]
        sent = [(e["attempt"], e["idempotency_key"]) for e in events
                if e["event"] == "StepCommandSent" and e["step"] == "book_courier"]
        assert sent == [(1, f"{saga_id}:book_courier"), (2, f"{saga_id}:book_courier")]  # same key, next attempt

    again = await saga_cli(stack.settings, "redrive", ids[0], "--reason", "again")
    assert again.returncode == 2 and "only a FAILED saga can be re-driven" in " ".join(again.stderr.split())
    audited = await saga_cli(stack.settings, "audit", timeout_s=120)
    assert audited.returncode == 0, audited.stdout + audited.stderr
    verified = await saga_cli(stack.settings, "verify", *ids)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_who_answered_a_deferred_command_is_in_the_saga_history(stack: Stack) -> None:
    saga_id = f"answer-{uuid.uuid4().hex[:6]}"
    async with SagaClient.from_settings(stack.settings) as client:
        handle = await client.start("courier_checkout", saga_id, _order(saga_id, "ask"))

        async def awaiting() -> bool:
            listed = await saga_cli(stack.settings, "awaiting", "courier", "--saga", saga_id, "--json")
            return listed.returncode == 0 and f"{saga_id}:book_courier" in listed.stdout

        assert await wait_for(awaiting, DEMO_TIMEOUT_S, 0.5), "the courier did not defer"
        answered = await saga_cli(stack.settings, "answer", "courier", f"{saga_id}:book_courier",
                                  "--output", "", "--operator", "pat", "--detail", "booked by phone")
        assert answered.returncode == 0, answered.stdout + answered.stderr
        assert "as pat" in answered.stdout
        ended = await handle.result(timeout_s=DEMO_TIMEOUT_S)
    assert isinstance(ended, SagaCompleted)
    events = await _history(stack, saga_id)
    at = next(i for i, e in enumerate(events) if e["event"] == "OperatorAction")
    assert (events[at]["action"], events[at]["operator"], events[at]["detail"]) == (
        "Answer", "pat", "book_courier: booked by phone")
    assert (events[at + 1]["event"], events[at + 1]["step"]) == ("StepSucceeded", "book_courier")
    verified = await saga_cli(stack.settings, "verify", saga_id)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_who_replayed_a_dead_letter_is_in_its_saga_history_and_the_letter_list(stack: Stack) -> None:
    saga_id = f"replay-{uuid.uuid4().hex[:6]}"
    start = StartSaga(saga_id=saga_id, saga_type="cruise", tenant_id=None, input=b"\xc3\x01not deployed")
    await publish(stack.settings, Topics(stack.settings.saga_topic_prefix).start, saga_id.encode(),
                  wire.encode_start(start))  # no such saga type: rejected (REJECTED) and dead-lettered

    async def letters() -> list[dict[str, Any]]:
        return await _json_lines(stack, "dlq", "list", "--saga", saga_id, "--json")

    async def parked() -> bool:
        return len(await letters()) == 1

    assert await wait_for(parked, 30, 0.5), "the start was not dead-lettered"
    [letter] = await letters()
    replayed = await saga_cli(stack.settings, "dlq", "replay", letter["position"], "--operator", "quinn",
                              "--reason", "cruise deployed")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "recorded in its history" in replayed.stdout and "by quinn" in replayed.stdout

    events = await _until(stack, saga_id, "DlqReplay", "quinn")
    [record] = [e for e in events if e["event"] == "OperatorAction"]
    assert record["detail"] == (f"letter {letter['position']} from {letter['source_topic']} "
                                f"{letter['source_partition']}:{letter['source_offset']} to "
                                f"{letter['source_topic']}: cruise deployed")

    async def parked_again() -> bool:  # still no cruise: the replayed start is refused again, a new letter
        return len(await letters()) == 2

    assert await wait_for(parked_again, 30, 0.5)
    first, second = sorted(await letters(), key=lambda found: found["failed_at"])
    assert [r["operator"] for r in first["replays"]] == ["quinn"] and second["replays"] == []
    headers = {h["key"]: base64.b64decode(h["value_base64"]).decode() for h in second["original_headers"]}
    dlq = Topics(stack.settings.saga_topic_prefix).dlq
    assert (headers["replayed_by"], headers["replayed_from"]) == ("quinn", f"{dlq}:{letter['position']}")
    shown = await saga_cli(stack.settings, "dlq", "list", "--saga", saga_id)
    assert shown.returncode == 0 and "1x, last by quinn" in shown.stdout, shown.stdout + shown.stderr
