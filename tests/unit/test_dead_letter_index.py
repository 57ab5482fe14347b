"""The dead-letter index's pure parts: the row a record on saga.dlq becomes, the letter a row gives back, and a
replay's choice of letters over the index."""

from __future__ import annotations

import pytest

from saga_orchestrator.operations.dead_letters import DeadLetterError, chosen, listed, parked_of
from saga_orchestrator.orchestrator.dead_letter_index import indexed
from saga_orchestrator.orchestrator.ports import LetterFilter
from saga_orchestrator.orchestrator.store.dead_letters import MemoryDeadLetterIndex
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.message_types import DeadLetter

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
