"""An operator's levers through the real services: RetryNow from the CLI and from the client, on a checkout whose
confirmation waits an hour between attempts, recorded with the operator and the reason; a lever that cannot
apply recorded as refused; `saga audit` and `saga verify` agree afterwards."""

from __future__ import annotations

import asyncio
import json
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
from saga_orchestrator.schemas.event_types import SagaCancelRefused, SagaCompensated, SagaCompleted, StepRetryScheduled
from tests.chaos.crash_tools import started_and_ready
from tests.conftest import module_stack
from tests.e2e.harness import Stack, saga_cli

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("logs")
    patient = settings.model_copy(update={"saga_app": "tests.e2e.apps:PATIENT"})
    yield from module_stack(started_and_ready(patient, log_dir), log_dir)


async def _history(stack: Stack, saga_id: str) -> list[dict[str, Any]]:
    """`saga history ID --json`: its events, in order."""
    shown = await saga_cli(stack.settings, "history", saga_id, "--json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    decoder, text, events, at = json.JSONDecoder(), shown.stdout, [], 0
    while (at := _skip_space(text, at)) < len(text):
        event, at = decoder.raw_decode(text, at)
        events.append(event)
    return events


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
                      "shipping": {"done": 1, "undone": 0}, "mail": {"done": 0, "undone": 0}}  # no undo to ship
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
