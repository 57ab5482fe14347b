"""Dead letters: which letters a filter or a replay picks, the record a replay publishes, which replays are
held back, and what a dismissal marks and audits."""

from __future__ import annotations

import base64

import pytest

from saga_orchestrator.operations.audit import OperatorAudit
from saga_orchestrator.operations.dead_letters import (
    DISMISS,
    REPLAYED_BY,
    REPLAYED_FROM,
    DeadLetterError,
    NotReplayable,
    Parked,
    dismiss,
    dismissal_of,
    dismissal_record,
    letter_record,
    matches,
    parse_position,
    plan_replays,
    replay_detail,
    replay_of,
    select,
)
from saga_orchestrator.orchestrator.dead_letter_index import indexed
from saga_orchestrator.orchestrator.recorded_replays import Replayed, replays_by_letter
from saga_orchestrator.orchestrator.store.dead_letters import MemoryDeadLetterIndex
from saga_orchestrator.orchestrator.store.memory import MemoryStore
from saga_orchestrator.orchestrator.store.operations.audit import MemoryLevers
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import OperatorAction
from saga_orchestrator.schemas.message_types import DeadLetter, Lever

DLQ = "saga.dlq"


def _parked(partition: int = 0, offset: int = 0, *, saga_id: str | None = "trip-1", source: str = "saga.start",
            reason: str = "unknown saga_type 'cruise' (known: trip)", failed_at: int = 1_000,
            value: bytes | None = b"\xc3\x01original", key: bytes | None = b"trip-1",
            headers: tuple[tuple[str, bytes | None], ...] = (("message_id", b"m-1"), ("trace", b"t-1"))) -> Parked:
    letter = DeadLetter(source_topic=source, source_partition=4, source_offset=17, consumer="orchestrator",
                             reason=reason, failed_at=failed_at, saga_id=saga_id, original_key=key,
                             original_value=value, original_headers=headers)
    return Parked(partition, offset, failed_at + 5, letter)


def test_a_replay_is_the_original_record_with_a_message_id_of_its_letter() -> None:
    replay = replay_of(_parked(2, 9), DLQ, "quinn")
    assert (replay.topic, replay.key, replay.value) == ("saga.start", b"trip-1", b"\xc3\x01original")
    assert replay.headers == [("trace", b"t-1"), ("message_id", b"dlq-replay:saga.dlq:2:9"),
                              (REPLAYED_FROM, b"saga.dlq:2:9"), (REPLAYED_BY, b"quinn")]


def test_replaying_the_same_letter_twice_gives_the_same_message_id_and_another_letter_another() -> None:
    first, again = replay_of(_parked(2, 9), DLQ, "quinn"), replay_of(_parked(2, 9), DLQ, "rosa")
    other = replay_of(_parked(2, 10), DLQ, "quinn")
    assert dict(first.headers)["message_id"] == dict(again.headers)["message_id"]
    assert dict(first.headers)["message_id"] != dict(other.headers)["message_id"]


def test_a_replayed_letter_replayed_again_names_only_its_newest_origin() -> None:
    parked = _parked(1, 3, headers=(("message_id", b"dlq-replay:saga.dlq:2:9"), (REPLAYED_FROM, b"saga.dlq:2:9"),
                                    (REPLAYED_BY, b"quinn"), ("empty", None)))
    assert replay_of(parked, DLQ, "rosa").headers == [("message_id", b"dlq-replay:saga.dlq:1:3"),
                                                      (REPLAYED_FROM, b"saga.dlq:1:3"), (REPLAYED_BY, b"rosa")]


def test_the_replays_a_history_records_are_found_by_their_letter() -> None:
    parked = _parked(2, 9)
    detail = replay_detail(parked, replay_of(parked, DLQ, "quinn"), "cruise deployed")
    assert detail == "letter 2:9 from saga.start 4:17 to saga.start: cruise deployed"

    def action(seq: int, operator: str, text: str, lever: str = Lever.DLQ_REPLAY) -> OperatorAction:
        return OperatorAction(saga_id="trip-1", seq=seq, definition_version=1, occurred_at=seq * 1000, action=lever,
                              operator=operator, detail=text)

    events = [action(3, "quinn", detail), action(4, "rosa", replay_detail(parked, replay_of(parked, DLQ, "rosa"),
                                                                          None)),
              action(5, "sam", "letter 2:9 from a skip", Lever.SKIP), action(6, "tom", "by hand")]
    assert replays_by_letter(events) == {"2:9": [Replayed("quinn", 3000), Replayed("rosa", 4000)]}


@pytest.mark.parametrize(("parked", "why"), [
    (_parked(value=None), "does not hold the original value"),
    (Parked(0, 5, 1_000, None), "not a readable dead letter"),
])
def test_a_letter_without_its_record_is_not_replayable(parked: Parked, why: str) -> None:
    with pytest.raises(NotReplayable, match=why):
        replay_of(parked, DLQ, "quinn")


@pytest.mark.parametrize(("filters", "expected"), [
    ({}, True),
    ({"saga_id": "trip-1"}, True),
    ({"saga_id": "trip-2"}, False),
    ({"source": "saga.start"}, True),
    ({"source": "flight.commands"}, False),
    ({"reason": "UNKNOWN SAGA_TYPE"}, True),
    ({"reason": "undecodable"}, False),
    ({"since_ms": 1_000}, True),
    ({"since_ms": 1_001}, False),
])
def test_filters(filters: dict[str, object], expected: bool) -> None:
    assert matches(_parked(), **filters) is expected  # type: ignore[arg-type]


def test_an_unreadable_record_passes_only_the_time_filter() -> None:
    unreadable = Parked(0, 1, 2_000, None)
    assert matches(unreadable, since_ms=2_000)
    assert not matches(unreadable, since_ms=2_001)
    assert not matches(unreadable, saga_id="trip-1")


def test_select_takes_positions_and_a_sagas_letters_once_each_oldest_first() -> None:
    parked = [_parked(0, 0, saga_id="a", failed_at=300), _parked(0, 1, saga_id="b", failed_at=100),
              _parked(1, 0, saga_id="a", failed_at=200), _parked(1, 1, saga_id="c", failed_at=50)]
    chosen = select(parked, [(0, 0), (1, 1)], "a", DLQ)
    assert [p.position for p in chosen] == ["1:1", "1:0", "0:0"]


def test_select_names_every_position_without_a_letter() -> None:
    with pytest.raises(DeadLetterError, match=r"^no dead letter at 3:7, 9:9 on saga\.dlq;"):
        select([_parked(0, 0)], [(0, 0), (3, 7), (9, 9)], None, DLQ)
    with pytest.raises(DeadLetterError, match="no dead letter of saga 'trip-9'"):
        select([_parked(0, 0)], [], "trip-9", DLQ)


@pytest.mark.parametrize("text", ["3", "3:x", "-1:2", "3:17:1"])
def test_a_position_is_partition_colon_offset(text: str) -> None:
    assert parse_position(" 3:17 ") == (3, 17)
    with pytest.raises(DeadLetterError, match="is not a dead-letter position"):
        parse_position(text)


def test_a_letter_as_json_carries_the_original_bytes() -> None:
    record = letter_record(_parked(2, 9))
    assert record["position"] == "2:9"
    assert base64.b64decode(str(record["original_value_base64"])) == b"\xc3\x01original"
    assert record["original_headers"] == [{"key": "message_id", "value_base64": base64.b64encode(b"m-1").decode()},
                                          {"key": "trace", "value_base64": base64.b64encode(b"t-1").decode()}]
    assert letter_record(Parked(0, 1, 5, None)) == {"position": "0:1", "timestamp": 5, "replays": [],
                                                    "readable": False}
    assert letter_record(_parked(2, 9), [Replayed("quinn", 3000)])["replays"] == [{"operator": "quinn", "at": 3000}]


async def _statuses(known: dict[str, str], asked: list[set[str]], saga_ids: set[str]) -> dict[str, str]:
    asked.append(saga_ids)
    return {saga_id: status for saga_id, status in known.items() if saga_id in saga_ids}


@pytest.mark.parametrize(("force", "replayed"), [(False, ["0:0", "0:2", "0:3"]), (True, ["0:0", "0:1", "0:2", "0:3"])])
async def test_a_replay_holds_back_an_ended_sagas_step_messages_unless_forced(force: bool,
                                                                              replayed: list[str]) -> None:
    chosen = [_parked(0, 0, saga_id="running", source="flight.results", failed_at=1),
              _parked(0, 1, saga_id="undone", source="flight.results", failed_at=2),
              _parked(0, 2, saga_id="undone", source="saga.start", failed_at=3),  # a start: nothing to redo
              _parked(0, 3, saga_id="unknown", source="hotel.commands", failed_at=4),  # no history: no status
              _parked(0, 4, value=None, failed_at=5), Parked(0, 5, 6, None)]
    asked: list[set[str]] = []
    plan = await plan_replays(chosen, DLQ, "quinn",
                              lambda ids: _statuses({"running": "RUNNING", "undone": "COMPENSATION_FAILED"}, asked,
                                                    ids),
                              force=force, force_hint="force it", resume_hint="resume it")
    assert [item.position for item, _ in plan.replays] == replayed
    assert asked == [{"running", "undone", "unknown"}]  # the replayable letters' sagas, in one look-up
    refused = dict((item.position, why) for item, why in plan.refused)
    assert refused.pop("0:4").startswith("the letter does not hold the original value")
    assert refused.pop("0:5") == "not a readable dead letter"
    assert refused == ({} if force else {"0:1": "saga undone ended COMPENSATION_FAILED, and a step's command or "
                                                "reply after its end could redo what it undid; resume it; force it"})
    notes = plan.notes("quinn", "fixed")
    assert [(n.saga_id, n.action, n.operator) for n in notes] == [
        (item.letter.saga_id, Lever.DLQ_REPLAY, "quinn") for item, _ in plan.replays
        if item.letter and item.letter.saga_id != "unknown"]
    assert notes[0].reason == "letter 0:0 from flight.results 4:17 to flight.results: fixed"
    assert [plan.recorded(item) for item, _ in plan.replays] == [p != "0:3" for p in replayed]


async def test_a_dismissal_marks_the_letters_handled_audits_each_and_refuses_without_a_reason() -> None:
    index, audit = MemoryDeadLetterIndex(), OperatorAudit(MemoryLevers(MemoryStore()))
    letter = _parked(0, 3).letter
    assert letter is not None
    await index.record([indexed(0, 3, 1_000, wire.encode_dead_letter(letter)), indexed(1, 0, 2_000, b"junk")], {})
    for positions, reason, said in ((["0:3"], None, "a reason is required"), (["0:3"], "  ", "a reason is required"),
                                    ([], "mistake", "name the letters to dismiss"),
                                    (["0:3", "7:7"], "mistake", "no dead letter at 7:7"),
                                    (["x"], "mistake", "not a dead-letter position")):
        with pytest.raises(DeadLetterError, match=said):
            await dismiss(index, audit, positions, "anna", reason, 5_000, DLQ)
    assert await index.unhandled(None, None, None, 10) != []
    assert all(x.dismissed_at_ms is None for x in index.letters.values())  # a refusal marks nothing
    done = await dismiss(index, audit, ["1:0", "0:3"], "anna", " a start made by mistake ", 5_000, DLQ)
    assert [p.position for p in done] == ["0:3", "1:0"]  # oldest failure first
    assert await index.unhandled(None, None, None, 10) == []
    [row] = await index.at([(1, 0)])
    assert dismissal_record(dismissal_of(row)) == {"operator": "anna", "reason": "a start made by mistake",
                                                   "at": 5_000}
    entries = await audit.entries()
    assert [(e.action, e.target, e.outcome.split(":")[0]) for e in entries] == [
        (DISMISS, "dead letter 1:0", "dismissed; nothing re-sent"),
        (DISMISS, "dead letter 0:3", "dismissed; nothing re-sent"),
        (DISMISS, "dead letters x", "refused"), (DISMISS, "dead letters 0:3, 7:7", "refused"),
        (DISMISS, "dead letters ", "refused"), (DISMISS, "dead letters 0:3", "refused"),
        (DISMISS, "dead letters 0:3", "refused")]
    assert entries[1].detail == {"saga": "trip-1", "reason": "a start made by mistake"}
    assert dismissal_of(indexed(2, 0, 1, b"junk")) is None and dismissal_record(None) is None
