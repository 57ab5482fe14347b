"""Signals and typed answers through the real services (the app tests.e2e.apps:WAITS).

Loans wait up to 8 s for their Approval: sent twice under one signal id, by two of three senders (`saga signal`,
``SagaClient.signal``, and a plain aiokafka producer writing the documented SignalSaga record with fastavro from
the .avsc files alone), each is taken once and the loan completes; loans never approved fail their wait
(SignalTimedOut) 8 s after it began and turn back. A signal-with-start starts its saga; a payload of the wrong
record is refused by the client, and dead-lettered when a plain producer sends it anyway. A deferred review is
answered with `saga answer`: an answer its output model refuses changes nothing; a good one is the next step's
typed parameter.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import fastavro
import pytest
from aiokafka import AIOKafkaProducer

from examples.loans.loan import Application, Approval, Hold
from saga_orchestrator.client import SagaClient, SagaInputError
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import (
    Event,
    SagaCompensated,
    SagaCompleted,
    SagaRejected,
    SignalAwaited,
    SignalReceived,
    SignalRefused,
    StepFailed,
)
from saga_orchestrator.schemas.topics import Topics
from tests.chaos.crash_tools import started_and_ready
from tests.conftest import module_stack
from tests.e2e.harness import Stack, read_topic, saga_cli, terminal_events, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
RECORDS = Path(__file__).parent / "waits_schemas"
WAIT_MS = 8_000  # quick_loan's wait for its Approval
LATE_MS = 4_000  # how long after its timeout a wait may fail (timers, a busy 2-core machine)
ENDED_S = 60.0


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("logs")
    waits = settings.model_copy(update={"saga_app": "tests.e2e.apps:WAITS",
                                        "saga_participants": "treasury+notices+reviews"})
    yield from module_stack(started_and_ready(waits, log_dir), log_dir)


# -- a client of its own: fastavro and aiokafka, the records read from their .avsc files (docs/starting.md) --------

def _single_object(schema_file: Path, record: dict[str, Any]) -> bytes:
    """``record`` single-object encoded with the schema in ``schema_file``, as docs/starting.md does it."""
    schema = fastavro.parse_schema(json.loads(schema_file.read_text()))
    canonical = fastavro.schema.to_parsing_canonical_form(schema)
    body = io.BytesIO()
    fastavro.schemaless_writer(body, schema, record)
    return b"\xc3\x01" + bytes.fromhex(fastavro.schema.fingerprint(canonical, "CRC-64-AVRO")) + body.getvalue()


def _plain_signal(saga_id: str, signal_id: str, payload: bytes, sender: str) -> bytes:
    return _single_object(ROOT / "schemas" / "commands" / "signal_saga.avsc", {
        "saga_id": saga_id, "signal_id": signal_id, "signal": "Approval", "payload": payload, "sender": sender,
        "start_saga_type": None, "start_input": None, "tenant_id": None})


def _approval_record(approval: Approval) -> bytes:
    return _single_object(RECORDS / "signals" / "saga.v1.loan.Approval.avsc", approval.model_dump())


async def _plain_send(producer: AIOKafkaProducer, settings: Settings, saga_id: str, value: bytes) -> None:
    await producer.send_and_wait(f"{settings.saga_topic_prefix}saga.control", key=saga_id.encode(), value=value,
                                 headers=[("message_id", uuid.uuid4().hex.encode())])


# -- reading what happened -----------------------------------------------------------------------------------------

def _application(saga_id: str, amount_cents: int = 5_000_00) -> Application:
    return Application(loan_id=saga_id, applicant=f"applicant of {saga_id}", amount_cents=amount_cents)


APPROVAL = Approval(approver="grace", limit_cents=10_000_00)


async def _start(client: SagaClient, saga_type: str, saga_ids: Sequence[str]) -> None:
    """Publish a StartSaga for each (at once: no handles, the store says how they went)."""
    await asyncio.gather(*(client.publish(client.topics.start, saga_id,
                                          client.encode_start(saga_type, saga_id, _application(saga_id)),
                                          saga_type=saga_type) for saga_id in saga_ids))


async def _events(stack: Stack, saga_ids: Sequence[str]) -> dict[str, list[Event]]:
    """Each saga's recorded events, in order."""
    conn = await asyncpg.connect(stack.settings.dsn())
    try:
        rows = await conn.fetch("SELECT saga_id, body FROM saga.events WHERE saga_id = ANY($1::text[]) "
                                "ORDER BY saga_id, seq", list(saga_ids))
    finally:
        await conn.close()
    found: dict[str, list[Event]] = {saga_id: [] for saga_id in saga_ids}
    for row in rows:
        found[row["saga_id"]].append(wire.decode_event(row["body"]))
    return found


async def _ledger(stack: Stack, schema: str, saga_ids: Sequence[str]) -> dict[tuple[str, str], str]:
    """(saga id, step) → state of each row of participant ``schema``'s ledger for the sagas."""
    conn = await asyncpg.connect(stack.settings.dsn())
    try:
        rows = await conn.fetch(f"SELECT saga_id, step, state FROM {schema}.ledger WHERE saga_id = ANY($1::text[])",
                                list(saga_ids))
    finally:
        await conn.close()
    return {(row["saga_id"], row["step"]): row["state"] for row in rows}


async def _until_all(stack: Stack, saga_ids: Sequence[str], has: Callable[[list[Event]], bool],
                     timeout_s: float, what: str) -> dict[str, list[Event]]:
    """The sagas' events once each saga's satisfy ``has`` (fails after ``timeout_s``, naming those that do not)."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = await _events(stack, saga_ids)
        missing = [saga_id for saga_id in saga_ids if not has(events[saga_id])]
        if not missing:
            return events
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(missing)} sagas without {what} after {timeout_s} s, e.g. "
                                 f"{missing[0]}: {[type(e).__name__ for e in events[missing[0]]]}")
        await asyncio.sleep(0.1)


def _awaiting(events: list[Event]) -> bool:
    return any(isinstance(e, SignalAwaited) for e in events)


def _of(events: list[Event], kind: type[Event]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def _names(events: list[Event]) -> list[str]:
    return [type(e).__name__ for e in events]


# -- signals ---------------------------------------------------------------------------------------------------

Send = Callable[[str, str], Awaitable[None]]  # (saga id, signal id)


async def test_each_approval_sent_twice_is_taken_once_and_unapproved_loans_turn_back_after_their_wait(
        stack: Stack) -> None:
    run = uuid.uuid4().hex[:6]
    approved = [f"sig-{run}-{n:03d}" for n in range(100)]
    never = [f"never-{run}-{n:02d}" for n in range(20)]
    # Who sends each approval, first and then again with the same signal id: `saga signal` for a handful (each
    # run is a process of its own), SagaClient.signal and a plain producer for the others, in turn.
    senders = [("cli", "client"), ("cli", "plain"), ("client", "cli"), ("plain", "cli")]
    senders += [("client", "plain") if n % 2 else ("plain", "client") for n in range(len(senders), len(approved))]
    producer = AIOKafkaProducer(bootstrap_servers=stack.settings.kafka_servers(), acks="all")
    await producer.start()
    try:
        async with SagaClient.from_settings(stack.settings) as client:
            async def cli(saga_id: str, signal_id: str) -> None:
                sent = await saga_cli(stack.settings, "signal", saga_id, "Approval", "--payload",
                                      APPROVAL.model_dump_json(), "--signal-id", signal_id, "--sender", "by-cli")
                assert sent.returncode == 0 and signal_id in sent.stdout, sent.stdout + sent.stderr

            async def by_client(saga_id: str, signal_id: str) -> None:
                assert await client.signal(saga_id, "Approval", APPROVAL, signal_id=signal_id,
                                           sender="by-client") == signal_id

            async def plain(saga_id: str, signal_id: str) -> None:
                await _plain_send(producer, stack.settings, saga_id,
                                  _plain_signal(saga_id, signal_id, _approval_record(APPROVAL), "by-plain"))

            send: dict[str, Send] = {"cli": cli, "client": by_client, "plain": plain}

            async def sendings(turn: int) -> None:
                await asyncio.gather(*(send[pair[turn]](saga_id, f"approval-of-{saga_id}")
                                       for saga_id, pair in zip(approved, senders, strict=True)))

            await _start(client, "quick_loan", approved + never)
            await _until_all(stack, approved + never, _awaiting, 30, "SignalAwaited")
            # Every first sending is on Kafka before any second one: the first is what each saga takes. (Two `saga
            # signal` processes at a time: the first sendings must come within the 8 s wait, the second may not.)
            began = time.monotonic()
            await sendings(0)
            sending_s = time.monotonic() - began
            await sendings(1)
    finally:
        await producer.stop()

    ended = await terminal_events(stack.settings, approved + never, ENDED_S)
    events = await _events(stack, approved + never)
    wrong = {saga_id: _names(events[saga_id]) for saga_id in approved
             if not isinstance(ended.get(saga_id), SagaCompleted)}
    assert not wrong, f"{len(wrong)} approved loans did not complete (the first sendings took {sending_s:.1f} s): " \
                      f"{dict(list(wrong.items())[:3])}"
    for saga_id, (first, _) in zip(approved, senders, strict=True):
        received = _of(events[saga_id], SignalReceived)
        assert [(r.signal, r.signal_id, r.sender) for r in received] == [
            ("Approval", f"approval-of-{saga_id}", f"by-{first}")], (saga_id, _names(events[saga_id]))
        assert not _of(events[saga_id], SignalRefused) and not _of(events[saga_id], SagaRejected), \
            (saga_id, _names(events[saga_id]))
    paid = await _ledger(stack, "treasury", approved)
    assert sorted(state for (_, step), state in paid.items() if step == "disburse") == sorted(
        f"paid from H-{saga_id}" for saga_id in approved)

    for saga_id in never:
        history = events[saga_id]
        assert isinstance(ended.get(saga_id), SagaCompensated), (saga_id, _names(history))
        [awaited] = _of(history, SignalAwaited)
        [failed] = [e for e in _of(history, StepFailed) if e.step == "await_approval"]
        assert failed.error_type == "SignalTimedOut" and not failed.retryable, failed
        waited_ms = failed.occurred_at - awaited.occurred_at
        assert awaited.timeout_at == awaited.occurred_at + WAIT_MS, awaited
        assert WAIT_MS <= waited_ms <= WAIT_MS + LATE_MS, (saga_id, waited_ms)
        assert not _of(history, SignalReceived), (saga_id, _names(history))
    held = await _ledger(stack, "treasury", never)
    assert held == {(saga_id, "hold_funds"): "released" for saga_id in never}


async def test_a_signal_with_start_starts_its_saga_and_takes_the_signal(stack: Stack) -> None:
    saga_id = f"sws-{uuid.uuid4().hex[:6]}"
    async with SagaClient.from_settings(stack.settings) as client:
        for _ in range(2):  # the second, with the same signal id, neither starts it again nor is taken again
            await client.signal(saga_id, "Approval", APPROVAL, signal_id=f"start-{saga_id}", sender="bank",
                                saga_type="quick_loan", start_input=_application(saga_id))
    ended = await terminal_events(stack.settings, [saga_id], ENDED_S)
    [history] = (await _events(stack, [saga_id])).values()
    names = _names(history)
    assert isinstance(ended.get(saga_id), SagaCompleted), names
    # Taken in the decision that started the saga, before its step came to wait for it.
    assert names[0] == "SagaStarted" and names.count("SignalReceived") == 1, names
    assert names.index("SignalReceived") < names.index("SignalAwaited"), names
    assert history[names.index("SignalReceived")].occurred_at == history[0].occurred_at, names
    assert "SagaRejected" not in names and "SignalRefused" not in names, names


async def test_a_payload_of_the_wrong_record_is_refused_by_the_client_and_dead_lettered_raw(stack: Stack) -> None:
    saga_id = f"wrong-{uuid.uuid4().hex[:6]}"
    topics = Topics(stack.settings.saga_topic_prefix)
    async with SagaClient.from_settings(stack.settings) as client:
        await _start(client, "quick_loan", [saga_id])
        await _until_all(stack, [saga_id], _awaiting, 30, "SignalAwaited")
        for wrong in (Hold(hold_id="H-1"), {"approver": "grace"}):
            with pytest.raises(SagaInputError) as refused:
                await client.signal(saga_id, "Approval", wrong, signal_id="wrong-at-client")
            assert refused.value.field == "payload" and "saga.v1.loan.Approval" in refused.value.problem, \
                refused.value

        producer = AIOKafkaProducer(bootstrap_servers=stack.settings.kafka_servers())
        await producer.start()
        try:
            hold = _single_object(RECORDS / "outputs" / "saga.v1.treasury.Hold.avsc", {"hold_id": "H-1"})
            await _plain_send(producer, stack.settings, saga_id, _plain_signal(saga_id, "wrong-raw", hold, "plain"))
        finally:
            await producer.stop()
        reason = "signal Approval carries saga.v1.loan.Approval, not saga.v1.treasury.Hold"
        rejected = await _until_all(stack, [saga_id], lambda events: bool(_of(events, SagaRejected)), 20,
                                    "SagaRejected")
        assert [e.reason for e in _of(rejected[saga_id], SagaRejected)] == [reason], _names(rejected[saga_id])
        # The saga still waits: the right approval, sent now, is taken.
        await client.signal(saga_id, "Approval", APPROVAL, signal_id="right", sender="grace's desk")
    ended = await terminal_events(stack.settings, [saga_id], ENDED_S)
    history = (await _events(stack, [saga_id]))[saga_id]
    assert isinstance(ended.get(saga_id), SagaCompleted), _names(history)
    assert [(e.signal_id, e.sender) for e in _of(history, SignalReceived)] == [("right", "grace's desk")]
    assert not _of(history, SignalRefused), _names(history)
    letters = [wire.decode_dead_letter(record.value) for record in await read_topic(stack.settings, topics.dlq)
               if record.key == saga_id.encode()]
    assert [(letter.saga_id, letter.source_topic, letter.reason) for letter in letters] == [
        (saga_id, topics.control, reason)], letters


# -- typed answers ---------------------------------------------------------------------------------------------

async def test_a_review_answered_with_saga_answer_is_checked_against_its_model_and_taken_by_the_next_step(
        stack: Stack) -> None:
    saga_id = f"review-{uuid.uuid4().hex[:6]}"
    key = f"{saga_id}:ask_review"
    async with SagaClient.from_settings(stack.settings) as client:
        handle = await client.start("reviewed_loan", saga_id, _application(saga_id))

        async def awaiting() -> bool:
            listed = await saga_cli(stack.settings, "awaiting", "reviews", "--saga", saga_id, "--json")
            assert listed.returncode == 0, listed.stdout + listed.stderr
            return [json.loads(line)["idempotency_key"] for line in listed.stdout.splitlines()] == [key]

        assert await wait_for(awaiting, 30, 0.5), "the review was not deferred"
        before = _names((await _events(stack, [saga_id]))[saga_id])
        bad = {'{"score": "high", "reviewer": "ada"}': "score: Input should be a valid integer",
               '{"score": 4}': "reviewer: Field required"}
        answers = await asyncio.gather(*(saga_cli(stack.settings, "answer", "reviews", key, "--output", output,
                                                  "--operator", "pat") for output in bad))
        for answered, problem in zip(answers, bad.values(), strict=True):
            said = answered.stdout + answered.stderr
            assert answered.returncode == 2, said
            assert "answer refused: the answer does not fit Review, the output of reviews.ask_review" in said, said
            assert problem in said and "Traceback" not in said, said
        assert await awaiting(), "a refused answer took the command off the awaiting list"
        assert _names((await _events(stack, [saga_id]))[saga_id]) == before

        good = await saga_cli(stack.settings, "answer", "reviews", key, "--output",
                              '{"score": 4, "reviewer": "ada"}', "--operator", "pat")
        assert good.returncode == 0, good.stdout + good.stderr
        ended = await handle.result(timeout_s=ENDED_S)
    history = (await _events(stack, [saga_id]))[saga_id]
    assert isinstance(ended, SagaCompleted), _names(history)
    assert _names(history)[len(before):len(before) + 2] == ["OperatorAction", "StepSucceeded"], _names(history)
    assert "StepFailed" not in _names(history), _names(history)
    assert await _ledger(stack, "reviews", [saga_id]) == {(saga_id, "ask_review"): "asked",
                                                          (saga_id, "file_review"): "scored 4 by ada"}
