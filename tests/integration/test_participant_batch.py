"""A batch of command deliveries in one transaction has the effect of the same deliveries one by one."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import asyncpg
import pytest

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.participants.kit.ddl import ensure_participant_schema
from saga_orchestrator.participants.kit.handling import Disposition, handle_command, handle_commands
from saga_orchestrator.participants.kit.outcome import Failed, Outcome, ReceivedCommand, Succeeded
from saga_orchestrator.participants.kit.participant import Call, Participant
from saga_orchestrator.participants.registry import REFERENCE_PARTICIPANTS, get_participant
from saga_orchestrator.schemas.registry import default_registry
from tests.integration.test_participants import FLIGHT, PAYMENT, TOPICS, command, delivered, processed, replies

pytestmark = pytest.mark.integration

Message = tuple[bytes, dict[str, bytes]]
# Reply fields that differ between two runs: ids (saga ids, database serials in ``output``), times, and the
# dead letter's copy of the original (it holds the saga id).
VARYING = frozenset({"saga_id", "idempotency_key", "output", "original_value", "original_headers", "failed_at",
                     "reason"})


@pytest.fixture(scope="module")
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, 8)
    for participant in map(get_participant, REFERENCE_PARTICIPANTS):
        await ensure_participant_schema(pool, participant)
    yield pool
    await pool.close()


def deliveries(sid: Callable[[int], str]) -> list[tuple[Participant, Message]]:
    """Payment commands of five sagas (and one of them twice, as a redelivery) and flight commands."""
    return [
        (PAYMENT, command(sid(0), "payment", "charge_card")),
        (PAYMENT, command(sid(1), "payment", "charge_card", card_token="tok_declined")),
        (PAYMENT, command(sid(2), "payment", "charge_card", card_token="tok_flaky")),  # transient
        (PAYMENT, command(sid(3), "payment", "charge_card", card_token="tok_slow")),  # reply held back
        (PAYMENT, command(sid(4), "payment", "charge_card", attempt=2)),  # recorded before the batch
        (PAYMENT, (b"\x00not avro", {"message_id": f"{sid(5)}:command:1".encode(), "saga_id": sid(5).encode()})),
        (FLIGHT, command(sid(6), "flight", "book_flight")),
        (FLIGHT, command(sid(7), "flight", "book_flight", destination="LHR")),  # same airport: refused
    ]


async def observe(pool: asyncpg.Pool, sid: Callable[[int], str]) -> list[Any]:
    """Everything the deliveries left behind, per saga, with the saga ids taken out."""
    seen: list[Any] = []
    for n in range(8):
        for schema in ("payment", "flight"):
            rows = await processed(pool, schema, sid(n))
            results = [(r["name"], {k: v for k, v in r["result"].items() if k not in VARYING}, r["due_in_s"] > 1)
                       for r in await replies(pool, schema, sid(n))]
            seen.append((schema, n, [(r["step"], r["status"], r["error_type"]) for r in rows], results))
    charges = await pool.fetch("SELECT saga_id FROM payment.charges WHERE saga_id LIKE $1", sid(0)[:-2] + "%")
    bookings = await pool.fetch("SELECT saga_id FROM flight.bookings WHERE saga_id LIKE $1", sid(0)[:-2] + "%")
    seen.append(sorted(r["saga_id"][-1] for r in charges))
    seen.append(sorted(r["saga_id"][-1] for r in bookings))
    return seen


def ids() -> Callable[[int], str]:
    run = uuid.uuid4().hex[:10]
    return lambda n: f"saga-{run}-{n}"


async def test_a_batch_has_the_effect_of_its_deliveries_one_by_one(pool: asyncpg.Pool) -> None:
    singly, batched = ids(), ids()
    for sid in (singly, batched):  # the redelivered command's first attempt, before anything else
        value, headers = command(sid(4), "payment", "charge_card")
        disposition = await handle_command(pool, PAYMENT, TOPICS, delivered(PAYMENT, value, headers))
        assert disposition is Disposition.RECORDED

    one_by_one = [await handle_command(pool, p, TOPICS, delivered(p, value, headers))
                  for p, (value, headers) in deliveries(singly)]
    in_batches = []
    for participant in (PAYMENT, FLIGHT):
        batch = [delivered(participant.name, value, headers)
                 for p, (value, headers) in deliveries(batched) if p is participant]
        in_batches += await handle_commands(pool, participant, TOPICS, batch)

    assert in_batches == one_by_one == [
        Disposition.RECORDED, Disposition.RECORDED, Disposition.TRANSIENT, Disposition.RECORDED,
        Disposition.DUPLICATE, Disposition.DEAD_LETTERED, Disposition.RECORDED, Disposition.RECORDED,
    ]
    assert await observe(pool, batched) == await observe(pool, singly)


async def test_a_key_twice_in_one_batch_sees_its_first_delivery(pool: asyncpg.Pool) -> None:
    sid = ids()
    value, headers = command(sid(0), "payment", "charge_card")
    twice = [delivered("payment", value, headers), delivered("payment", value, headers)]
    assert await handle_commands(pool, PAYMENT, TOPICS, twice) == [Disposition.RECORDED, Disposition.DUPLICATE]
    assert await pool.fetchval("SELECT count(*) FROM payment.charges WHERE saga_id = $1", sid(0)) == 1
    assert [r["result"]["status"] for r in await replies(pool, "payment", sid(0))] == ["SUCCEEDED", "SUCCEEDED"]


async def test_a_batch_that_fails_leaves_nothing_behind(pool: asyncpg.Pool) -> None:
    sid = ids()
    batch = [delivered("payment", *command(sid(n), "payment", "charge_card"))
             for n in range(3)]

    def broken_clock() -> int:
        raise ConnectionResetError("the database went away mid-batch")

    with pytest.raises(ConnectionResetError):
        await handle_commands(pool, PAYMENT, TOPICS, batch, clock=broken_clock)
    for n in range(3):
        assert await processed(pool, "payment", sid(n)) == []
        assert await replies(pool, "payment", sid(n)) == []
    assert await handle_commands(pool, PAYMENT, TOPICS, batch) == [Disposition.RECORDED] * 3


async def mark_then_decide(conn: asyncpg.Connection, command: ReceivedCommand, trip: Mapping[str, Any]) -> Outcome:
    """Writes a row, then fails when the trip says so: a failed step must leave no row behind."""
    await conn.execute("INSERT INTO batchtest.marks (saga_id) VALUES ($1)", command.saga_id)
    if trip["card_token"] == "tok_fail":
        return Failed("Refused", "this one fails after writing")
    if trip["card_token"] == "tok_raise":
        raise ValueError("a handler bug, after writing")
    return Succeeded()


MARKER = Participant(name="payment", schema="batchtest", handlers={"charge_card": mark_then_decide},
                     business_ddl=("CREATE TABLE IF NOT EXISTS batchtest.marks (saga_id text NOT NULL)",))


async def test_only_the_failed_handlers_writes_are_undone(pool: asyncpg.Pool) -> None:
    await ensure_participant_schema(pool, MARKER)
    sid = ids()
    tokens = ["tok_ok", "tok_fail", "tok_ok", "tok_raise", "tok_ok"]
    batch = [delivered("payment", *command(sid(n), "payment", "charge_card", card_token=token))
             for n, token in enumerate(tokens)]
    assert await handle_commands(pool, MARKER, TOPICS, batch) == [
        Disposition.RECORDED, Disposition.RECORDED, Disposition.RECORDED, Disposition.TRANSIENT,
        Disposition.RECORDED]
    marked = await pool.fetch("SELECT saga_id FROM batchtest.marks WHERE saga_id LIKE $1", sid(0)[:-2] + "%")
    assert sorted(r["saga_id"] for r in marked) == [sid(0), sid(2), sid(4)]
    statuses = [[(r["status"], r["error_type"]) for r in await processed(pool, "batchtest", sid(n))] for n in range(5)]
    assert statuses == [[("SUCCEEDED", None)], [("FAILED", "Refused")], [("SUCCEEDED", None)], [],
                        [("SUCCEEDED", None)]]


def recording_participant(calls: list[list[str]], *, single: bool, miscount: bool = False) -> Participant:
    """A participant whose ``charge_card`` batch handler writes one mark per command in one statement and
    notes which sagas each of its calls got; ``single`` adds a one-command handler, ``miscount`` makes the
    batch handler answer one outcome short."""

    async def mark_many(conn: asyncpg.Connection, batch: Sequence[Call]) -> list[Outcome]:
        calls.append([command.saga_id for command, _ in batch])
        await conn.execute("INSERT INTO batchtest.marks (saga_id) SELECT unnest($1::text[])",
                           [command.saga_id for command, _ in batch])
        outcomes: list[Outcome] = [Succeeded() for _ in batch]
        return outcomes[:-1] if miscount else outcomes

    async def mark_one(conn: asyncpg.Connection, command: ReceivedCommand, trip: Mapping[str, Any]) -> Outcome:
        calls.append([f"single {command.saga_id}"])
        await conn.execute("INSERT INTO batchtest.marks (saga_id) VALUES ($1)", command.saga_id)
        return Succeeded()

    return Participant(name="payment", schema="batchtest", batch_handlers={"charge_card": mark_many},
                       handlers={"charge_card": mark_one, "refund_card": mark_one} if single else {},
                       business_ddl=MARKER.business_ddl)


async def test_consecutive_commands_of_an_action_go_to_its_batch_handler_together(pool: asyncpg.Pool) -> None:
    calls: list[list[str]] = []
    participant = recording_participant(calls, single=True)
    await ensure_participant_schema(pool, participant)
    sid = ids()
    actions = ["charge_card", "charge_card", "refund_card", "charge_card", "charge_card", "charge_card"]
    batch = [delivered("payment", *command(sid(n), "payment", action))
             for n, action in enumerate(actions)]
    assert await handle_commands(pool, participant, TOPICS, batch) == [Disposition.RECORDED] * 6
    # Delivery order is kept: the refund between them splits the charges into two batch calls.
    assert calls == [[sid(0), sid(1)], [f"single {sid(2)}"], [sid(3), sid(4), sid(5)]]
    marked = await pool.fetch("SELECT saga_id FROM batchtest.marks WHERE saga_id LIKE $1", sid(0)[:-2] + "%")
    assert sorted(r["saga_id"] for r in marked) == [sid(n) for n in range(6)]


async def test_a_lone_command_uses_the_batch_handler_when_it_is_the_only_one(pool: asyncpg.Pool) -> None:
    calls: list[list[str]] = []
    participant = recording_participant(calls, single=False)
    await ensure_participant_schema(pool, participant)
    sid = ids()
    value, headers = command(sid(0), "payment", "charge_card")
    disposition = await handle_command(pool, participant, TOPICS, delivered(participant, value, headers))
    assert disposition is Disposition.RECORDED
    assert calls == [[sid(0)]]
    assert [(r["status"], r["error_type"]) for r in await processed(pool, "batchtest", sid(0))] == [
        ("SUCCEEDED", None)]


async def test_a_batch_handler_with_too_few_outcomes_is_redone_one_command_at_a_time(pool: asyncpg.Pool) -> None:
    calls: list[list[str]] = []
    participant = recording_participant(calls, single=True, miscount=True)
    await ensure_participant_schema(pool, participant)
    sid = ids()
    batch = [delivered("payment", *command(sid(n), "payment", "charge_card"))
             for n in range(3)]
    assert await handle_commands(pool, participant, TOPICS, batch) == [Disposition.RECORDED] * 3
    assert calls == [[sid(0), sid(1), sid(2)], *([f"single {sid(n)}"] for n in range(3))]
    marked = await pool.fetch("SELECT saga_id FROM batchtest.marks WHERE saga_id LIKE $1", sid(0)[:-2] + "%")
    assert sorted(r["saga_id"] for r in marked) == [sid(n) for n in range(3)]  # the first pass rolled back


async def test_reference_batch_handlers_book_each_command_once(pool: asyncpg.Pool) -> None:
    sid = ids()
    batch = [delivered("flight", *command(sid(n), "flight", "book_flight"))
             for n in range(4)]
    assert await handle_commands(pool, FLIGHT, TOPICS, batch) == [Disposition.RECORDED] * 4
    rows = await pool.fetch("SELECT saga_id, booking_id FROM flight.bookings WHERE saga_id LIKE $1 ORDER BY saga_id",
                            sid(0)[:-2] + "%")
    assert [r["saga_id"] for r in rows] == [sid(n) for n in range(4)]
    for n, row in enumerate(rows):  # each reply names its own booking
        (reply,) = await replies(pool, "flight", sid(n))
        assert reply["result"]["status"] == "SUCCEEDED"
        assert default_registry().decode(reply["result"]["output"]) == ("saga.v1.flight.FlightBooking",
                                                                        {"booking_id": row["booking_id"]})


def counting_participant(calls: dict[str, int]) -> Participant:
    """A participant whose ``charge_card`` handler counts its calls per saga, writes a mark, and then fails for
    good on ``tok_fail``, raises on ``tok_raise`` and says the disk is full on ``tok_full``."""

    async def charge(conn: asyncpg.Connection, command: ReceivedCommand, trip: Mapping[str, Any]) -> Outcome:
        calls[command.saga_id] = calls.get(command.saga_id, 0) + 1
        await conn.execute("INSERT INTO batchtest.marks (saga_id) VALUES ($1)", command.saga_id)
        if trip["card_token"] == "tok_fail":
            return Failed("Refused", "this one fails for good, after writing")
        if trip["card_token"] == "tok_raise":
            raise ValueError("a handler bug, after writing")
        if trip["card_token"] == "tok_full" and calls[command.saga_id] == 1:
            raise asyncpg.DiskFullError("could not extend file: No space left on device")
        return Succeeded()

    return Participant(name="payment", schema="batchtest", handlers={"charge_card": charge},
                       business_ddl=MARKER.business_ddl)


async def marks(pool: asyncpg.Pool, sid: Callable[[int], str]) -> list[str]:
    rows = await pool.fetch("SELECT saga_id FROM batchtest.marks WHERE saga_id LIKE $1", sid(0)[:-2] + "%")
    return sorted(r["saga_id"] for r in rows)


@pytest.mark.parametrize(("token", "disposition"), [("tok_fail", Disposition.RECORDED),
                                                     ("tok_raise", Disposition.TRANSIENT)])
async def test_in_a_batch_of_twenty_each_handler_runs_once_and_the_failed_one_leaves_no_row(
        pool: asyncpg.Pool, token: str, disposition: Disposition) -> None:
    calls: dict[str, int] = {}
    participant = counting_participant(calls)
    await ensure_participant_schema(pool, participant)
    sid = ids()
    batch = [delivered("payment", *command(sid(n), "payment", "charge_card",
                                           card_token=token if n == 7 else "tok_ok")) for n in range(20)]
    dispositions = await handle_commands(pool, participant, TOPICS, batch)
    assert dispositions == [disposition if n == 7 else Disposition.RECORDED for n in range(20)]
    assert calls == {sid(n): 1 for n in range(20)}
    assert await marks(pool, sid) == sorted(sid(n) for n in range(20) if n != 7)
    (reply,) = await replies(pool, "batchtest", sid(7))
    assert reply["result"]["status"] == "FAILED"
    assert reply["result"]["error_type"] == ("Refused" if token == "tok_fail" else "ParticipantError")


async def test_a_platform_fault_in_a_handler_keeps_nothing_and_the_batch_goes_through_later(
        pool: asyncpg.Pool) -> None:
    calls: dict[str, int] = {}
    participant = counting_participant(calls)
    await ensure_participant_schema(pool, participant)
    sid = ids()
    batch = [delivered("payment", *command(sid(n), "payment", "charge_card",
                                           card_token="tok_full" if n == 2 else "tok_ok")) for n in range(4)]
    with pytest.raises(asyncpg.DiskFullError):  # the worker waits it out, the batch unacknowledged
        await handle_commands(pool, participant, TOPICS, batch)
    assert await marks(pool, sid) == []
    assert [await processed(pool, "batchtest", sid(n)) for n in range(4)] == [[]] * 4
    assert await handle_commands(pool, participant, TOPICS, batch) == [Disposition.RECORDED] * 4
    assert await marks(pool, sid) == [sid(n) for n in range(4)]
    # The commands before the fault ran again: their first run was rolled back with the batch (the README says
    # what a handler that calls an outside system must do about it: pass the idempotency key on).
    assert calls == {sid(0): 2, sid(1): 2, sid(2): 2, sid(3): 1}


@pytest.mark.parametrize(("token", "disposition", "error_type"), [("tok_fail", Disposition.RECORDED, "Refused"),
                                                                  ("tok_raise", Disposition.TRANSIENT,
                                                                   "ParticipantError")])
async def test_a_lone_command_whose_handler_fails_runs_once_and_leaves_no_row(
        pool: asyncpg.Pool, token: str, disposition: Disposition, error_type: str) -> None:
    # One handler call in its transaction takes no savepoint: the transaction is rolled back and run again
    # without the handler, its outcome recorded as it was.
    calls: dict[str, int] = {}
    participant = counting_participant(calls)
    await ensure_participant_schema(pool, participant)
    sid = ids()
    record = delivered("payment", *command(sid(0), "payment", "charge_card", card_token=token))
    assert await handle_command(pool, participant, TOPICS, record) is disposition
    assert calls == {sid(0): 1} and await marks(pool, sid) == []
    (reply,) = await replies(pool, "batchtest", sid(0))
    assert (reply["result"]["status"], reply["result"]["error_type"]) == ("FAILED", error_type)
