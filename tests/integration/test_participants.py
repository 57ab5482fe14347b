"""Participants on real Postgres (the kit called directly) and one real faust worker on real Kafka."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.participants.kit.ddl import ensure_participant_schema
from saga_orchestrator.participants.kit.handling import Disposition, handle_command
from saga_orchestrator.participants.kit.participant import Participant
from saga_orchestrator.participants.registry import REFERENCE_PARTICIPANTS, get_participant
from saga_orchestrator.participants.trip.effects import collect_effects, effects_by_idempotency_key_counts
from saga_orchestrator.participants.trip.payment import SLOW_REPLY_DELAY_MS
from saga_orchestrator.schemas.headers import HeadersArg, header_pairs
from saga_orchestrator.schemas.records import ConsumedRecord
from saga_orchestrator.schemas.registry import default_registry
from saga_orchestrator.schemas.topics import Topics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TRIP: dict[str, Any] = {
    "customer_id": "cust_1", "origin": "LHR", "destination": "JFK", "depart_date": "2030-01-01",
    "return_date": "2030-01-08", "currency": "EUR", "card_token": "tok_visa", "email": "ann@example.com",
    "amount_cents": 12_300,
}
FLIGHT = get_participant("flight")
PAYMENT = get_participant("payment")
TOPICS = Topics("it-")  # the direct-call tests never reach Kafka; the prefix only shows in outbox rows


def new_saga_id() -> str:
    return f"saga-{uuid.uuid4().hex[:12]}"


def command(
    saga_id: str, step: str, action: str, *, compensate: bool = False, attempt: int = 1, **trip: Any
) -> tuple[bytes, dict[str, bytes]]:
    """An encoded StepCommand and its headers, as the orchestrator would send them."""
    registry = default_registry()
    key = f"{saga_id}:{step}:compensate" if compensate else f"{saga_id}:{step}"
    value = registry.encode(
        "saga.v1.StepCommand",
        {
            "saga_id": saga_id, "saga_type": "trip", "step": step, "action": action,
            "kind": "COMPENSATE" if compensate else "FORWARD", "idempotency_key": key, "attempt": attempt,
            "input": registry.encode("saga.v1.trip.TripRequest", {**TRIP, **trip}),
        },
    )
    headers = {"message_id": f"{saga_id}:command:{attempt}".encode(), "saga_id": saga_id.encode(),
               "saga_type": b"trip"}
    return value, headers


@pytest.fixture(scope="module")
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, 8)
    for participant in map(get_participant, REFERENCE_PARTICIPANTS):
        await ensure_participant_schema(pool, participant)
        await ensure_participant_schema(pool, participant)  # idempotent
    yield pool
    await pool.close()


def delivered(participant: Participant | str, value: bytes | None, headers: HeadersArg, *, partition: int = -1,
              offset: int = -1, key: bytes | None = None) -> ConsumedRecord:
    """A command as handed to the kit: from ``participant``'s commands topic, without a Kafka position unless
    one is given (a direct call)."""
    name = participant if isinstance(participant, str) else participant.name
    return ConsumedRecord(topic=TOPICS.commands(name), partition=partition, offset=offset, key=key, value=value,
                          headers=header_pairs(headers))


async def handle(
    pool: asyncpg.Pool, participant: Participant, message: tuple[bytes, dict[str, bytes]]
) -> Disposition:
    return await handle_command(pool, participant, TOPICS, delivered(participant, *message))


async def replies(pool: asyncpg.Pool, schema: str, saga_id: str) -> list[dict[str, Any]]:
    """The outbox rows addressed to ``saga_id``, oldest first, with the StepResult decoded."""
    rows: list[asyncpg.Record] = await pool.fetch(
        f"""SELECT topic, message_key, value, headers::text AS headers, message_id,
                   extract(epoch FROM available_at - now()) AS due_in_s
            FROM {schema}.outbox WHERE message_key = $1 ORDER BY id""",
        saga_id,
    )
    out: list[dict[str, Any]] = []
    for row in rows:
        name, result = default_registry().decode(row["value"])
        out.append({**dict(row), "headers": orjson.loads(row["headers"]), "name": name, "result": result})
    return out


async def processed(pool: asyncpg.Pool, schema: str, saga_id: str) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await pool.fetch(
        f"SELECT * FROM {schema}.processed_commands WHERE saga_id = $1 ORDER BY processed_at", saga_id
    )
    return rows


async def test_success_writes_the_booking_the_record_and_the_reply_together(pool: asyncpg.Pool) -> None:
    saga_id = new_saga_id()
    assert await handle(pool, FLIGHT, command(saga_id, "flight", "book_flight")) is Disposition.RECORDED

    bookings = await pool.fetch("SELECT * FROM flight.bookings WHERE saga_id = $1", saga_id)
    assert [(b["step"], b["idempotency_key"], b["status"]) for b in bookings] == [
        ("flight", f"{saga_id}:flight", "booked")
    ]
    [record] = await processed(pool, "flight", saga_id)
    assert (record["status"], record["action"], record["attempt"]) == ("SUCCEEDED", "book_flight", 1)
    [reply] = await replies(pool, "flight", saga_id)
    assert reply["topic"] == "it-flight.results"
    assert reply["message_id"] == f"{saga_id}:flight:reply:1"
    assert reply["headers"] == {
        "message_id": f"{saga_id}:flight:reply:1", "causation_id": f"{saga_id}:command:1",
        "saga_id": saga_id, "saga_type": "trip",
    }
    assert reply["name"] == "saga.v1.StepResult"
    result = reply["result"]
    assert (result["status"], result["kind"], result["attempt"]) == ("SUCCEEDED", "FORWARD", 1)
    assert default_registry().decode(result["output"]) == ("saga.v1.flight.FlightBooking",
                                                           {"booking_id": bookings[0]["booking_id"]})
    assert reply["due_in_s"] <= 0


async def test_a_redelivered_command_gets_the_recorded_reply_and_no_booking_twice(pool: asyncpg.Pool) -> None:
    saga_id = new_saga_id()
    first = command(saga_id, "flight", "book_flight")
    assert await handle(pool, FLIGHT, first) is Disposition.RECORDED
    assert await handle(pool, FLIGHT, first) is Disposition.DUPLICATE  # same delivery again
    retry = command(saga_id, "flight", "book_flight", attempt=2)  # a retry after a timeout
    assert await handle(pool, FLIGHT, retry) is Disposition.DUPLICATE

    assert await pool.fetchval("SELECT count(*) FROM flight.bookings WHERE saga_id = $1", saga_id) == 1
    assert len(await processed(pool, "flight", saga_id)) == 1
    rows = await replies(pool, "flight", saga_id)
    assert [r["message_id"] for r in rows] == [f"{saga_id}:flight:reply:{n}" for n in (1, 1, 2)]
    assert rows[0]["value"] == rows[1]["value"]  # byte-identical: the orchestrator's inbox drops it
    assert rows[2]["result"] == {**rows[0]["result"], "attempt": 2}
    assert rows[2]["headers"]["causation_id"] == f"{saga_id}:command:2"


async def test_concurrent_deliveries_of_one_key_do_the_work_once(pool: asyncpg.Pool) -> None:
    saga_id = new_saga_id()
    message = command(saga_id, "flight", "book_flight")
    outcomes = await asyncio.gather(*(handle(pool, FLIGHT, message) for _ in range(6)))
    assert sorted(outcomes) == sorted([Disposition.RECORDED] + [Disposition.DUPLICATE] * 5)
    assert await pool.fetchval("SELECT count(*) FROM flight.bookings WHERE saga_id = $1", saga_id) == 1
    assert {r["result"]["status"] for r in await replies(pool, "flight", saga_id)} == {"SUCCEEDED"}


async def test_a_definitive_failure_is_recorded_and_leaves_no_business_trace(pool: asyncpg.Pool) -> None:
    saga_id = new_saga_id()
    message = command(saga_id, "flight", "book_flight", destination="LHR")
    assert await handle(pool, FLIGHT, message) is Disposition.RECORDED
    assert await handle(pool, FLIGHT, message) is Disposition.DUPLICATE

    assert await pool.fetchval("SELECT count(*) FROM flight.bookings WHERE saga_id = $1", saga_id) == 0
    [record] = await processed(pool, "flight", saga_id)
    assert (record["status"], record["error_type"]) == ("FAILED", "InvalidRoute")
    results = [r["result"] for r in await replies(pool, "flight", saga_id)]
    assert len(results) == 2
    for result in results:
        assert (result["status"], result["retryable"]) == ("FAILED", False)
        assert result["error_type"] == "InvalidRoute"


async def test_a_transient_failure_is_not_recorded_so_a_later_attempt_charges(pool: asyncpg.Pool) -> None:
    saga_id = new_saga_id()
    for attempt in (1, 2):
        message = command(saga_id, "payment", "charge_card", attempt=attempt, card_token="tok_flaky")
        assert await handle(pool, PAYMENT, message) is Disposition.TRANSIENT
        assert await processed(pool, "payment", saga_id) == []
        assert await pool.fetchval("SELECT count(*) FROM payment.charges WHERE saga_id = $1", saga_id) == 0
    third = command(saga_id, "payment", "charge_card", attempt=3, card_token="tok_flaky")
    assert await handle(pool, PAYMENT, third) is Disposition.RECORDED
    assert await handle(pool, PAYMENT, third) is Disposition.DUPLICATE

    charges = await pool.fetch("SELECT * FROM payment.charges WHERE saga_id = $1", saga_id)
    assert [(c["amount_cents"], c["currency"], c["status"]) for c in charges] == [(12_300, "EUR", "charged")]
    results = [r["result"] for r in await replies(pool, "payment", saga_id)]
    assert [(r["attempt"], r["status"], r["retryable"], r["error_type"]) for r in results] == [
        (1, "FAILED", True, "CardNetworkTimeout"),
        (2, "FAILED", True, "CardNetworkTimeout"),
        (3, "SUCCEEDED", False, None),
        (3, "SUCCEEDED", False, None),
    ]


async def test_a_slow_charge_commits_but_its_reply_waits_while_a_retry_is_answered_at_once(
    pool: asyncpg.Pool,
) -> None:
    saga_id = new_saga_id()
    first = command(saga_id, "payment", "charge_card", card_token="tok_slow")
    assert await handle(pool, PAYMENT, first) is Disposition.RECORDED
    assert await pool.fetchval("SELECT count(*) FROM payment.charges WHERE saga_id = $1", saga_id) == 1
    retry = command(saga_id, "payment", "charge_card", attempt=2, card_token="tok_slow")
    assert await handle(pool, PAYMENT, retry) is Disposition.DUPLICATE

    delayed, immediate = await replies(pool, "payment", saga_id)
    assert delayed["message_id"] == f"{saga_id}:payment:reply:1"
    held_s = SLOW_REPLY_DELAY_MS / 1000
    assert held_s - 1.0 < delayed["due_in_s"] <= held_s
    assert immediate["message_id"] == f"{saga_id}:payment:reply:2"
    assert immediate["due_in_s"] <= 0
    assert immediate["result"]["status"] == "SUCCEEDED"
    assert await pool.fetchval("SELECT count(*) FROM payment.charges WHERE saga_id = $1", saga_id) == 1


async def test_malformed_bytes_go_to_the_dead_letter_topic_and_nothing_else(pool: asyncpg.Pool) -> None:
    saga_id = new_saga_id()
    headers = {"message_id": f"{saga_id}:command:1".encode(), "saga_id": saga_id.encode()}
    value = b"\xc3\x01" + b"\x00" * 8 + b"garbage"
    record = delivered(FLIGHT, value, headers, partition=2, offset=77, key=saga_id.encode())
    outcome = await handle_command(pool, FLIGHT, TOPICS, record)
    assert outcome is Disposition.DEAD_LETTERED

    [row] = await replies(pool, "flight", saga_id)
    assert (row["topic"], row["message_id"]) == ("it-saga.dlq", "dlq:it-flight.commands:2:77")
    assert row["name"] == "saga.v1.DeadLetter"
    letter = row["result"]
    assert (letter["source_topic"], letter["source_partition"], letter["source_offset"]) == (
        "it-flight.commands", 2, 77,
    )
    assert (letter["consumer"], letter["saga_id"], letter["original_key"]) == (
        "participant-flight", saga_id, saga_id.encode(),
    )
    assert letter["original_value"] == value
    assert {h["key"]: h["value"] for h in letter["original_headers"]} == headers
    assert "UnknownFingerprint" in letter["reason"]
    assert await processed(pool, "flight", saga_id) == []
    assert await pool.fetchval("SELECT count(*) FROM flight.bookings WHERE saga_id = $1", saga_id) == 0


async def test_an_unknown_action_fails_for_good(pool: asyncpg.Pool) -> None:
    saga_id = new_saga_id()
    assert await handle(pool, FLIGHT, command(saga_id, "flight", "teleport")) is Disposition.RECORDED
    [reply] = await replies(pool, "flight", saga_id)
    assert (reply["result"]["status"], reply["result"]["error_type"]) == ("FAILED", "UnknownAction")


async def test_compensations_are_idempotent_and_tolerate_never_booked(pool: asyncpg.Pool) -> None:
    never_booked = new_saga_id()
    cancel = command(never_booked, "flight", "cancel_flight", compensate=True)
    assert await handle(pool, FLIGHT, cancel) is Disposition.RECORDED
    records = await processed(pool, "flight", never_booked)
    assert sorted((r["idempotency_key"], r["status"]) for r in records) == [
        (f"{never_booked}:flight", "COMPENSATED"),  # the tombstone that fences a late forward
        (f"{never_booked}:flight:compensate", "SUCCEEDED")]

    saga_id = new_saga_id()
    await handle(pool, FLIGHT, command(saga_id, "flight", "book_flight"))
    cancel = command(saga_id, "flight", "cancel_flight", compensate=True)
    assert await handle(pool, FLIGHT, cancel) is Disposition.RECORDED
    assert await handle(pool, FLIGHT, cancel) is Disposition.DUPLICATE
    status = await pool.fetchval("SELECT status FROM flight.bookings WHERE saga_id = $1", saga_id)
    assert status == "cancelled"
    cancel_reply = (await replies(pool, "flight", saga_id))[1]
    assert cancel_reply["message_id"] == f"{saga_id}:flight:compensate:reply:1"
    assert cancel_reply["result"]["kind"] == "COMPENSATE"

    refused = new_saga_id()
    await handle(pool, FLIGHT, command(refused, "flight", "book_flight", customer_id="cust_uncancellable"))
    cancel = command(refused, "flight", "cancel_flight", compensate=True, customer_id="cust_uncancellable")
    assert await handle(pool, FLIGHT, cancel) is Disposition.RECORDED
    assert await pool.fetchval("SELECT status FROM flight.bookings WHERE saga_id = $1", refused) == "booked"
    assert (await replies(pool, "flight", refused))[1]["result"]["error_type"] == "CancellationRefused"


async def test_every_reference_participant_and_the_effects_report(pool: asyncpg.Pool) -> None:
    saga_id = new_saga_id()
    steps: list[tuple[str, str, bool, dict[str, Any]]] = [
        ("flight", "book_flight", False, {}),
        ("hotel", "book_hotel", False, {}),
        ("payment", "charge_card", False, {}),
        ("notification", "send_itinerary", False, {}),
        ("payment", "refund_card", True, {}),
        ("hotel", "cancel_hotel", True, {}),
    ]
    for name, action, compensate, trip in steps:
        message = command(saga_id, name, action, compensate=compensate, **trip)
        assert await handle(pool, get_participant(name), message) is Disposition.RECORDED
    sold_out = new_saga_id()
    message = command(sold_out, "hotel", "book_hotel", destination="Atlantis")
    assert await handle(pool, get_participant("hotel"), message) is Disposition.RECORDED
    bounced = new_saga_id()
    bounce_attempts = [(1, Disposition.TRANSIENT), (3, Disposition.TRANSIENT), (4, Disposition.RECORDED)]
    for attempt, expected in bounce_attempts:
        message = command(bounced, "notification", "send_itinerary", attempt=attempt, email="x@bounce.test")
        assert await handle(pool, get_participant("notification"), message) is expected
    declined = new_saga_id()
    message = command(declined, "payment", "charge_card", card_token="tok_declined")
    assert await handle(pool, PAYMENT, message) is Disposition.RECORDED

    effects = await collect_effects(pool, saga_id)
    assert effects.counts() == {
        "flight": {"booked": 1, "cancelled": 0},
        "hotel": {"booked": 1, "cancelled": 1},
        "payment": {"charged": 1, "refunded": 1},
        "notification": {"sent": 1},
    }
    assert (effects.flights_booked, effects.hotels_cancelled) == (1, 1)
    assert (effects.charged, effects.refunded, effects.sent) == (1, 1, 1)
    as_json = orjson.loads(orjson.dumps(effects.to_dict()))
    assert as_json["participants"]["payment"]["rows"][0]["status"] == "refunded"
    assert len(as_json["participants"]["hotel"]["processed"]) == 2
    assert (await collect_effects(pool, sold_out)).hotels_booked == 0
    assert (await collect_effects(pool, bounced)).sent == 1
    assert (await collect_effects(pool, declined)).charged == 0

    counts = await effects_by_idempotency_key_counts(pool)
    assert counts["payment.charges"][f"{saga_id}:payment"] == 1
    assert all(n == 1 for table in counts.values() for n in table.values())
    assert await effects_by_idempotency_key_counts(pool, only_duplicates=True) == {
        spec: {} for spec in counts
    }


# --- the real worker: faust consumer + outbox relay in one subprocess --------------------------------


async def _read_until(
    consumer: AIOKafkaConsumer, count: int, within_s: float, worker: asyncio.subprocess.Process
) -> list[Any]:
    records: list[Any] = []
    deadline = time.monotonic() + within_s
    while len(records) < count and time.monotonic() < deadline and worker.returncode is None:
        batch = await consumer.getmany(timeout_ms=500)
        for messages in batch.values():
            records.extend(messages)
    return records


def _worker_env(kafka_bootstrap: str, database_url: str, prefix: str, home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "DATABASE_URL": database_url,
        "SAGA_TOPIC_PREFIX": prefix,
        "SAGA_TOPIC_PARTITIONS": "2",
        "SAGA_HOME": str(home),
        "SAGA_DB_POOL_SIZE": "2",
    }


@contextlib.asynccontextmanager
async def _running_worker(names: list[str], env: dict[str, str],
                          log_path: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """``python -m saga_orchestrator.participants.runner NAMES``, stopped with SIGTERM at the end (its returncode is
    then set)."""
    with log_path.open("wb") as log_file:
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "saga_orchestrator.participants.runner", *names,
            cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT,
        )
    try:
        yield worker
    finally:
        if worker.returncode is None:
            worker.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(worker.wait(), 60)
        except TimeoutError:
            worker.kill()
            raise


async def _send_and_read(kafka_bootstrap: str, worker: asyncio.subprocess.Process,
                         sends: list[tuple[str, str, tuple[bytes, dict[str, bytes]]]], read_topics: list[str],
                         count: int) -> list[Any]:
    """Produce each (topic, key, (value, headers)) of ``sends``, then read ``count`` records of ``read_topics``."""
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    consumer = AIOKafkaConsumer(*read_topics, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None)
    try:
        await producer.start()
        for topic, key, (value, headers) in sends:
            # The worker creates the topics at start; producing may briefly see them missing.
            await producer.send_and_wait(topic, value, key=key.encode(), headers=list(headers.items()))
        await consumer.start()
        return await _read_until(consumer, count, within_s=90, worker=worker)
    finally:
        await producer.stop()
        await consumer.stop()


async def test_the_faust_worker_answers_commands_over_kafka(
    kafka_bootstrap: str, database_url: str, topic_prefix: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    prefix = f"{topic_prefix}worker."
    topics = Topics(prefix)
    # The worker's relay publishes every row of the flight outbox: the rows the direct-call tests left there
    # (topics "it-...") would reach the broker under names no fixture deletes.
    await pool.execute("DELETE FROM flight.outbox WHERE topic NOT LIKE $1 || '%'", prefix)
    log_path = tmp_path / "worker.log"
    saga_id, failing = new_saga_id(), new_saga_id()
    sends = [
        (topics.commands("flight"), saga_id, command(saga_id, "flight", "book_flight")),
        (topics.commands("flight"), saga_id, command(saga_id, "flight", "book_flight")),  # duplicate delivery
        (topics.commands("flight"), failing, command(failing, "flight", "book_flight", destination="LHR")),
        (topics.commands("flight"), failing, (b"garbage", {"saga_id": failing.encode()})),
    ]
    async with _running_worker(["flight"], _worker_env(kafka_bootstrap, database_url, prefix, tmp_path),
                               log_path) as worker:
        records = await _send_and_read(kafka_bootstrap, worker, sends, [topics.results("flight"), topics.dlq], 4)
        assert worker.returncode is None, log_path.read_text()
    exit_code = worker.returncode

    log_text = log_path.read_text()
    by_topic: dict[str, list[Any]] = {}
    for record in records:
        by_topic.setdefault(record.topic, []).append(record)
    results = [default_registry().decode_as(r.value, "saga.v1.StepResult")[1] for r in
               by_topic.get(topics.results("flight"), [])]
    assert sorted((r["saga_id"], r["status"], r["error_type"]) for r in results) == sorted(
        [(saga_id, "SUCCEEDED", None), (saga_id, "SUCCEEDED", None), (failing, "FAILED", "InvalidRoute")]
    ), log_text
    # The two sagas' replies are on different partitions, so they may be read in either order.
    # The duplicate delivery is answered with the recorded reply: the same message id.
    replies = [record for record in by_topic[topics.results("flight")] if record.key == saga_id.encode()]
    assert [dict(reply.headers)["message_id"] for reply in replies] == [f"{saga_id}:flight:reply:1".encode()] * 2
    [dead] = by_topic[topics.dlq]
    assert default_registry().decode_as(dead.value, "saga.v1.DeadLetter")[1]["original_value"] == b"garbage"
    assert await pool.fetchval("SELECT count(*) FROM flight.bookings WHERE saga_id = $1", saga_id) == 1
    assert exit_code == 0, log_text


async def test_one_worker_hosts_several_participants(
    kafka_bootstrap: str, database_url: str, topic_prefix: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    prefix = f"{topic_prefix}shared."
    topics = Topics(prefix)
    for schema in ("flight", "hotel"):  # see test_the_faust_worker_answers_commands_over_kafka
        await pool.execute(f"DELETE FROM {schema}.outbox WHERE topic NOT LIKE $1 || '%'", prefix)
    log_path = tmp_path / "worker.log"
    saga_id = new_saga_id()
    sends = [(topics.commands(step), saga_id, command(saga_id, step, action))
             for step, action in (("flight", "book_flight"), ("hotel", "book_hotel"))]
    async with _running_worker(["flight", "hotel"], _worker_env(kafka_bootstrap, database_url, prefix, tmp_path),
                               log_path) as worker:
        records = await _send_and_read(kafka_bootstrap, worker, sends,
                                       [topics.results("flight"), topics.results("hotel")], 2)
        assert worker.returncode is None, log_path.read_text()

    log_text = log_path.read_text()
    results = {record.topic: default_registry().decode_as(record.value, "saga.v1.StepResult")[1]
               for record in records}
    assert {topic: (r["saga_id"], r["step"], r["status"]) for topic, r in results.items()} == {
        topics.results("flight"): (saga_id, "flight", "SUCCEEDED"),
        topics.results("hotel"): (saga_id, "hotel", "SUCCEEDED"),
    }, log_text
    for schema in ("flight", "hotel"):
        assert await pool.fetchval(f"SELECT count(*) FROM {schema}.bookings WHERE saga_id = $1", saga_id) == 1
    # One consumer group for the worker, named after both participants.
    async with KafkaClients(kafka_bootstrap).started_admin() as admin:
        groups = {group for group, _protocol in await admin.list_consumer_groups()}
    assert {group for group in groups if group.startswith(prefix)} == {f"{prefix}saga-participant-flight_hotel"}
    assert worker.returncode == 0, log_text
