"""The dead-letter index's pure parts: the row a record on saga.dlq becomes, the letter a row gives back, a
replay's choice of letters over the index, and the indexer's write of new letters whose replay their sagas'
histories already record."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.operations.dead_letters import DeadLetterError, chosen, listed, parked_of
from saga_orchestrator.orchestrator.dead_letter_index import DeadLetterIndexer, indexed
from saga_orchestrator.orchestrator.ports import LetterFilter, StoredEvent
from saga_orchestrator.orchestrator.store.dead_letters import MemoryDeadLetterIndex
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import OperatorAction
from saga_orchestrator.schemas.message_types import DeadLetter, Lever

DLQ = "saga.dlq"


def _value(saga_id: str | None = "trip-1", failed_at: int = 1_000, reason: str = "unknown saga_type 'cruise'") -> bytes:
    return wire.encode_dead_letter(DeadLetter(
        source_topic="saga.start", source_partition=4, source_offset=17, consumer="orchestrator", reason=reason,
        failed_at=failed_at, saga_id=saga_id, original_key=b"trip-1", original_value=b"\xc3\x01original",
        original_headers=(("message_id", b"m-1"),)))


def test_a_letter_is_indexed_by_its_position_with_the_fields_the_lists_filter_on() -> None:
    row = indexed(3, 17, 1_005, _value())
    assert (row.partition, row.offset, row.written_at_ms, row.failed_at_ms, row.saga_id, row.source_topic,
            row.reason, row.replayed_at_ms) == (3, 17, 1_005, 1_000, "trip-1", "saga.start",
                                                "unknown saga_type 'cruise'", None)
    parked = parked_of(row)
    assert (parked.position, parked.timestamp_ms) == ("3:17", 1_005)
    assert parked.letter is not None and parked.letter.original_value == b"\xc3\x01original"


@pytest.mark.parametrize("value", [b"not a dead letter", None])
def test_a_record_that_is_no_letter_is_indexed_as_failed_when_written(value: bytes | None) -> None:
    row = indexed(0, 2, 2_000, value)
    assert (row.failed_at_ms, row.saga_id, row.source_topic, row.reason, row.record) == (2_000, None, None, None,
                                                                                          value)
    assert parked_of(row).letter is None


async def test_a_replay_chooses_the_indexed_letters_at_positions_and_of_a_saga() -> None:
    index = MemoryDeadLetterIndex()
    await index.record([indexed(0, 0, 10, _value("a", 5)), indexed(1, 0, 30, _value("b", 25)),
                        indexed(0, 1, 20, _value("a", 15))], {0: 2, 1: 1})
    assert [p.position for p in await chosen(index, [(1, 0)], "a", DLQ)] == ["0:0", "0:1", "1:0"]
    assert [(p.position, d) for p, d in await listed(index, LetterFilter(), 2)] == [("1:0", None), ("0:1", None)]
    with pytest.raises(DeadLetterError, match="no dead letter at 7:7"):
        await chosen(index, [(7, 7)], None, DLQ)
    with pytest.raises(DeadLetterError, match="no dead letter of saga 'c'"):
        await chosen(index, [], "c", DLQ)


class Histories:
    """Saga histories holding operator actions only, counting the sagas each read asks for."""

    def __init__(self, *actions: OperatorAction) -> None:
        self.events = [StoredEvent(a.saga_id, a.seq, type(a).__name__, wire.encode_event(a), a.occurred_at)
                       for a in actions]
        self.asked: list[set[str]] = []

    async def events_of(self, saga_ids: Collection[str], event_types: Collection[str]) -> list[StoredEvent]:
        self.asked.append(set(saga_ids))
        return [e for e in self.events if e.saga_id in saga_ids and e.event_type in event_types]


def _replay(saga_id: str, seq: int, at_ms: int, position: str, lever: str = Lever.DLQ_REPLAY) -> OperatorAction:
    return OperatorAction(saga_id=saga_id, seq=seq, definition_version=1, occurred_at=at_ms, action=lever,
                          operator="quinn", detail=f"letter {position} from saga.start 4:17 to saga.start: fixed")


def _indexer(index: MemoryDeadLetterIndex, histories: Histories) -> DeadLetterIndexer:
    return DeadLetterIndexer(index, histories, KafkaClients("127.0.0.1:1"), DLQ)


async def test_a_new_letter_whose_replay_its_history_records_is_written_replayed_at_its_last_replay() -> None:
    index = MemoryDeadLetterIndex()
    histories = Histories(_replay("a", 3, 7_000, "0:0"), _replay("a", 5, 9_000, "0:0"), _replay("a", 6, 9_500, "0:4"),
                          _replay("b", 2, 8_000, "0:1", Lever.SKIP), _replay("c", 2, 8_000, "0:0"))
    await _indexer(index, histories).write(
        [indexed(0, 0, 10, _value("a", 5)), indexed(0, 1, 20, _value("b", 15)), indexed(0, 2, 30, b"junk")], {0: 3})
    assert histories.asked == [{"a", "b"}]  # one read, of the batch's sagas only
    assert {p: x.replayed_at_ms for p, x in index.letters.items()} == {(0, 0): 9_000, (0, 1): None, (0, 2): None}
    assert [(x.partition, x.offset) for x in await index.unhandled(None, None, None, 10)] == [(0, 1), (0, 2)]
    assert index.read_to == {0: 3}


async def test_letters_already_indexed_or_of_no_saga_read_no_history_and_are_left_as_they_are() -> None:
    index = MemoryDeadLetterIndex()
    await index.record([indexed(0, 0, 10, _value("a", 5))], {0: 1})
    histories = Histories(_replay("a", 3, 7_000, "0:0"))
    indexer = _indexer(index, histories)
    await indexer.write([indexed(0, 0, 10, _value("a", 5))], {0: 1})  # read again after a lost position
    await indexer.write([indexed(0, 1, 20, b"junk"), indexed(0, 2, 30, None), indexed(0, 3, 40, _value(None))],
                        {0: 4})
    assert histories.asked == []
    assert [x.replayed_at_ms for x in index.letters.values()] == [None, None, None, None]
