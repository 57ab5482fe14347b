"""The inbox (``operations.inbox``) on the test kit's memory store: every saga that needs a human, at any age,
stuck longest first, paged by cursor, and gone only once handled."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from saga_orchestrator.infra.kafka_admin import TopicAttendance
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.operations import inbox, paging, parked_rows
from saga_orchestrator.operations.attendance import Attendance, AttendanceSnapshot, CommandTopic
from saga_orchestrator.operations.inbox import InboxItem, InboxQuery, Kind, Link
from saga_orchestrator.operations.ports import OutboxView
from saga_orchestrator.operations.reads import Deferred
from saga_orchestrator.orchestrator.dead_letter_index import indexed
from saga_orchestrator.orchestrator.ports import SagaSummaryRow, Writes
from saga_orchestrator.orchestrator.store.dead_letters import MemoryDeadLetterIndex
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas.topics import Topics
from saga_orchestrator.testing import SagaEnvironment, fail, succeed


async def _quarantine(env: SagaEnvironment, saga_id: str) -> None:
    """A quarantined saga's read-model row (the kit quarantines none by itself)."""
    async with env.store.begin() as uow:
        await uow.write(Writes(summaries=[SagaSummaryRow(saga_id, "trip", None, "QUARANTINED", env.now, env.now, 1,
                                                         reason="undecodable reply")]))


async def _all(env: SagaEnvironment, query: InboxQuery) -> list[InboxItem]:
    """Every item, page by page; each page's cursor taken from the one before."""
    items: list[InboxItem] = []
    cursor: str | None = None
    while True:
        page = await inbox.inbox(env.reads, dataclasses.replace(query, cursor=cursor))
        items += page.items
        if page.next_cursor is None:
            return items
        cursor = page.next_cursor


async def test_the_inbox_lists_every_kind_of_saga_that_needs_a_human_stuck_longest_first() -> None:
    env = SagaEnvironment(TRIP)
    env.script(("notification", "send_itinerary"), fail("AddressGone"))
    failed = await env.start("trip", SCENARIOS["happy"].trip("t-1"))
    assert (await env.result(failed)).status == "FAILED"
    await env.advance(hours=26)  # no age cutoff: a saga that failed a day and more ago is still listed
    env.script(("notification", "send_itinerary"), succeed())
    env.script(("hotel", "book_hotel"), fail("NoRooms"))
    env.script(("flight", "cancel_flight"), fail("Refused"))
    undone = await env.start("trip", SCENARIOS["happy"].trip("t-2"))
    assert (await env.result(undone)).status == "COMPENSATION_FAILED"
    await env.advance(minutes=5)
    env.script(("flight", "cancel_flight"), fail("Busy", retryable=True))
    retrying = await env.start("trip", SCENARIOS["happy"].trip("t-3"))
    await env.advance(seconds=30)
    await _quarantine(env, "q-1")
    env.script(("hotel", "book_hotel"), succeed())
    done = await env.start("trip", SCENARIOS["happy"].trip("t-4"))
    assert (await env.result(done)).status == "COMPLETED"

    items = await _all(env, InboxQuery())
    assert [(i.kind, i.saga_id) for i in items] == [
        (Kind.FAILED, failed), (Kind.COMPENSATION_FAILED, undone), (Kind.COMPENSATION_RETRYING, retrying),
        (Kind.QUARANTINED, "q-1")]
    by_kind = {i.kind: i for i in items}
    assert by_kind[Kind.FAILED].stuck_since_ms == env.store.summaries[failed].updated_at_ms
    assert env.now - by_kind[Kind.FAILED].stuck_since_ms > 26 * 3_600_000
    assert [link.label for link in by_kind[Kind.FAILED].levers] == ["open", "Redrive", "ForceCompensate", "Terminate"]
    assert [link.label for link in by_kind[Kind.COMPENSATION_FAILED].levers] == ["open", "Resume", "Terminate"]
    assert [link.label for link in by_kind[Kind.QUARANTINED].levers] == ["open", "Release"]
    assert "send_itinerary" in by_kind[Kind.FAILED].what and "Busy" in by_kind[Kind.COMPENSATION_RETRYING].what
    assert await inbox.count(env.reads) == inbox.Count(4)  # what the inbox lists, every kind

    assert [i.saga_id for i in await _all(env, InboxQuery(kinds=inbox.kinds_of(["FAILED"])))] == [failed]
    assert await _all(env, InboxQuery(saga_type="refund")) == []
    window = InboxQuery(since_ms=by_kind[Kind.COMPENSATION_FAILED].stuck_since_ms,
                        before_ms=by_kind[Kind.QUARANTINED].stuck_since_ms)
    assert [i.saga_id for i in await _all(env, window)] == [undone, retrying]


async def test_paging_by_cursor_returns_each_item_once() -> None:
    env = SagaEnvironment(TRIP)
    env.script(("notification", "send_itinerary"), fail("AddressGone"))
    started = [await env.start("trip", SCENARIOS["happy"].trip(f"t-{n}")) for n in range(7)]
    await env.advance(minutes=1)
    for saga_id in ("q-1", "q-2"):
        await _quarantine(env, saga_id)  # two at the same millisecond: the id breaks the tie
    pages = []
    cursor: str | None = None
    while True:
        page = await inbox.inbox(env.reads, InboxQuery(limit=2, cursor=cursor))
        pages.append([i.saga_id for i in page.items])
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    listed = [saga_id or "" for ids in pages for saga_id in ids]
    assert sorted(listed) == sorted([*started, "q-1", "q-2"]) and len(listed) == len(set(listed)) == 9
    assert [len(ids) for ids in pages] == [2, 2, 2, 2, 1]


async def test_an_item_leaves_the_inbox_only_once_handled() -> None:
    env = SagaEnvironment(TRIP)
    env.script(("notification", "send_itinerary"), fail("AddressGone"))
    saga_id = await env.start("trip", SCENARIOS["happy"].trip("t-1"))
    await env.result(saga_id)
    await env.advance(days=30)
    assert [i.saga_id for i in (await inbox.inbox(env.reads, InboxQuery())).items] == [saga_id]  # time alone: kept
    env.script(("notification", "send_itinerary"), succeed())
    await env.redrive(saga_id, "address corrected")
    assert (await env.result(saga_id)).status == "COMPLETED"
    assert (await inbox.inbox(env.reads, InboxQuery())).items == [] and await inbox.count(env.reads) == inbox.Count(0)


def test_parked_rows_and_deferred_commands_merge_into_the_page_by_stuck_since() -> None:
    sagas = [SagaSummaryRow("s-1", "trip", None, "FAILED", 0, 2_000, 5, failed_step="pay", reason="Declined"),
             SagaSummaryRow("s-2", "trip", None, "RUNNING", 0, 4_000, 5, current_step="pay", step_failures=1)]
    parked = [OutboxView("saga.outbox_parked", 7, "payment.commands", 3_000, "s-9: message too large")]
    deferred = [Deferred("payment", "s-3", "charge_card", "charge", "s-3:charge_card", 1_000)]
    page = inbox.assemble(sagas, parked, deferred, InboxQuery())
    assert [(i.kind, i.saga_id) for i in page.items] == [
        (Kind.DEFERRED, "s-3"), (Kind.FAILED, "s-1"), (Kind.PARKED, "s-9")]  # s-2 failed once: not wedged
    assert page.items[2].what.startswith("payment.commands row 7") and page.next_cursor is None
    first = inbox.assemble(sagas, parked, deferred, InboxQuery(limit=2))
    assert first.next_cursor is not None
    rest = inbox.assemble(sagas, parked, deferred, InboxQuery(limit=2, cursor=first.next_cursor))
    assert [i.kind for i in rest.items] == [Kind.PARKED] and rest.next_cursor is None
    assert [i.kind for i in inbox.assemble(sagas, parked, deferred, InboxQuery(saga_type="trip")).items] == [
        Kind.FAILED]


def test_a_parked_row_links_its_levers_on_the_parked_page_and_its_saga() -> None:
    item = inbox.parked_item(OutboxView("flight.outbox_parked", 12, "flight.results", 3_000, "s-9: too large"))
    line = "/parked#parked-flight.outbox_parked-12"
    assert item.levers == (Link("requeue", line), Link("discard", line), Link("open", "/sagas/s-9"))
    assert item.what == "flight.results row 12 in flight.outbox_parked refused for good: too large"
    assert "lever" not in item.what and item.item_id == f"parked:flight.outbox_parked:{12:020d}"
    keyless = inbox.parked_item(OutboxView("saga.outbox_parked", 3, "saga.events", 1_000, None))
    assert keyless.saga_id is None and [link.label for link in keyless.levers] == ["requeue", "discard"]
    assert keyless.what.endswith("refused for good: no reason")


def test_a_parked_row_is_found_only_by_its_listed_table_and_id() -> None:
    rows = [OutboxView("saga.outbox_parked", 7, "payment.commands", 3_000, "s-9: message too large"),
            OutboxView("flight.outbox_parked", 7, "flight.results", 4_000, "s-8: no topic")]
    found = parked_rows.find(rows, "flight.outbox_parked", 7)
    assert found is rows[1] and parked_rows.outbox_of(found) == "flight.outbox"
    assert parked_rows.find(rows, "flight.outbox", 7) is None  # the outbox itself is not a parked table
    assert parked_rows.find(rows, "saga.outbox_parked; DROP TABLE x", 7) is None
    assert parked_rows.find(rows, "saga.outbox_parked", 8) is None
    said = parked_rows.discard_confirmation(rows[0])
    assert "for good" in said and "saga s-9" in said and "undoes nothing" in said


def test_a_bad_kind_or_cursor_is_refused() -> None:
    with pytest.raises(inbox.InboxError):
        inbox.kinds_of(["sleepy"])
    with pytest.raises(paging.BadCursor):
        inbox.assemble([], [], [], InboxQuery(cursor="not-a-cursor"))
    assert inbox.kinds_of(["COMPENSATION_FAILED", " wedged "]) == {Kind.COMPENSATION_FAILED, Kind.WEDGED}
    assert inbox.parse_moment_ms("1970-01-01T00:00:01") == 1000 and inbox.parse_moment_ms("") is None


async def test_dead_letters_neither_replayed_nor_dismissed_are_items_paged_with_the_rest() -> None:
    env = SagaEnvironment(TRIP)
    await _quarantine(env, "s-q")  # stuck since env.now
    letters = MemoryDeadLetterIndex()
    await letters.record([indexed(0, 3, env.now - 10, b"junk"), indexed(1, 0, env.now + 5, b"junk"),
                          indexed(0, 4, env.now - 10, b"junk"), indexed(2, 0, env.now - 20, b"junk")], {})
    await letters.mark_replayed([(2, 0)], env.now)
    await letters.record([indexed(3, 0, env.now - 30, b"junk")], {})
    await letters.dismiss([(3, 0)], "anna", "garbage nobody can read", env.now)  # handled: not an item
    items: list[InboxItem] = []
    cursor: str | None = None
    while True:  # a page of one: every cursor lands between two items
        page = await inbox.inbox(env.reads, InboxQuery(limit=1, cursor=cursor), letters)
        items += page.items
        if (cursor := page.next_cursor) is None:
            break
    assert [(i.kind, i.item_id) for i in items] == [
        (Kind.DEAD_LETTER, f"dead-letter:{0:010d}:{3:020d}"), (Kind.DEAD_LETTER, f"dead-letter:{0:010d}:{4:020d}"),
        (Kind.QUARANTINED, "s-q"), (Kind.DEAD_LETTER, f"dead-letter:{1:010d}:{0:020d}")]
    assert items[0].levers[0] == inbox.Link("dead letter", "/dead-letters?position=0:3")
    assert items[0].what == "a record on saga.dlq that is no readable letter"
    only = await inbox.inbox(env.reads, InboxQuery(kinds=frozenset({Kind.QUARANTINED})), letters)
    assert [i.kind for i in only.items] == [Kind.QUARANTINED]


def _snapshot(*topics: CommandTopic) -> AttendanceSnapshot:
    return AttendanceSnapshot({topic.participant: topic for topic in topics}, taken_at_ms=9_000)


async def test_a_command_topic_no_worker_consumes_is_an_item_when_commands_wait() -> None:
    env = SagaEnvironment(TRIP)
    await _quarantine(env, "s-q")  # stuck since env.now
    snapshot = _snapshot(
        CommandTopic("notification", "notification.commands", consumers=0, waiting=3, unattended_since_ms=env.now - 5),
        CommandTopic("payment", "payment.commands", consumers=2, waiting=40),  # attended: busy, not stuck
        CommandTopic("hotel", "hotel.commands", consumers=0, waiting=0),  # nobody reads, nothing waits
        CommandTopic("flight", "flight.commands"))  # unknown: Kafka did not answer
    page = await inbox.inbox(env.reads, InboxQuery(), attendance=snapshot)
    assert [(i.kind, i.item_id) for i in page.items] == [(Kind.UNATTENDED, "unattended:notification"),
                                                         (Kind.QUARANTINED, "s-q")]
    item = page.items[0]
    assert item.what == "no worker consumes notification.commands; 3 commands wait"
    assert item.stuck_since_ms == env.now - 5 and item.saga_id is None
    assert [link.href for link in item.levers] == ["/sagas?status=RUNNING", "/wedged"]
    only = await inbox.inbox(env.reads, InboxQuery(kinds=inbox.kinds_of(["unattended"])), attendance=snapshot)
    assert [i.kind for i in only.items] == [Kind.UNATTENDED]
    assert (await inbox.inbox(env.reads, InboxQuery(saga_type="trip"), attendance=snapshot)).items[0].kind == (
        Kind.QUARANTINED)  # a topic has no saga type
    assert [i.kind for i in (await inbox.inbox(env.reads, InboxQuery())).items] == [Kind.QUARANTINED]  # no snapshot


def test_a_topic_is_unattended_since_the_snapshot_first_saw_it_so() -> None:
    names = {"notification": "notification.commands"}
    unattended = {"notification.commands": TopicAttendance("notification.commands", 0, 2)}
    first = AttendanceSnapshot().followed_by(unattended, names, 1_000)
    later = first.followed_by({"notification.commands": TopicAttendance("notification.commands", 0, 5)}, names, 2_000)
    assert later.unattended()[0].unattended_since_ms == 1_000 and later.unattended()[0].waiting == 5
    hiccup = later.followed_by({}, names, 3_000)  # unknown: not listed, but the clock keeps running
    assert hiccup.unattended() == [] and hiccup.of("notification") == CommandTopic(
        "notification", "notification.commands", unattended_since_ms=1_000)
    assert hiccup.followed_by(unattended, names, 4_000).unattended()[0].unattended_since_ms == 1_000
    consumed = hiccup.followed_by({"notification.commands": TopicAttendance("notification.commands", 1, 2)}, names,
                                  5_000)
    topic = consumed.of("notification")
    assert consumed.unattended() == [] and topic == CommandTopic("notification", "notification.commands", 1, 2)
    assert topic.describe() == "1 worker consumes notification.commands"
    assert consumed.followed_by(unattended, names, 6_000).unattended()[0].unattended_since_ms == 6_000


async def test_the_attendance_refreshes_from_its_probe_and_says_unknown_before_the_first() -> None:
    asked: list[list[str]] = []

    async def probe(kafka: KafkaClients, topics: Sequence[str]) -> dict[str, TopicAttendance]:
        asked.append(list(topics))
        return {topic: TopicAttendance(topic, 0, 1) for topic in topics}

    attendance = Attendance(KafkaClients("127.0.0.1:1"), Topics("t."), ["payment", "notification"], lambda: 7,
                            probe=probe)
    assert attendance.snapshot.taken_at_ms is None and attendance.snapshot.of("payment") is None
    await attendance.refresh()
    assert asked == [["t.payment.commands", "t.notification.commands"]]
    assert [t.describe() for t in attendance.snapshot.unattended()] == [
        "no worker consumes t.notification.commands; 1 command waits",
        "no worker consumes t.payment.commands; 1 command waits"]


def test_a_step_in_flight_hears_when_no_worker_consumes_its_participant() -> None:
    snapshot = _snapshot(CommandTopic("payment", "payment.commands", consumers=0, waiting=1),
                         CommandTopic("hotel", "hotel.commands", consumers=1, waiting=0),
                         CommandTopic("flight", "flight.commands"))  # unknown: nothing said
    assert [t.describe() for t in snapshot.unconsumed(["payment", "hotel", "flight", None, "payment", "car"])] == [
        "no worker consumes payment.commands; 1 command waits"]
    assert AttendanceSnapshot().unconsumed(["payment"]) == []  # not taken yet
