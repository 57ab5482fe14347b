"""The patched record reading of aiokafka's fetcher (``infra.kafka_records``), on record batches built as a
broker returns them: ordinary batches read as aiokafka reads them, a header name that is not UTF-8 kept, and a
batch that cannot be read (a decompression bomb, a codec not installed) passed on as one record that says why,
while the consumer's position moves past it."""

from __future__ import annotations

import struct
from typing import Any

import aiokafka
import pytest
from aiokafka.consumer.fetcher import READ_UNCOMMITTED, PartitionRecords
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition

from saga_orchestrator.infra import kafka_records
from saga_orchestrator.infra.kafka_records import MAX_DECOMPRESSED_BATCH_BYTES, _Records, raw_header_name
from saga_orchestrator.schemas.records import UNREADABLE_HEADER, ConsumedRecord

TP = TopicPartition("t", 0)


class RawName(str):
    """A header name written as the given bytes (the pure-Python builder encodes names with ``encode``)."""

    raw: bytes

    def __new__(cls, raw: bytes) -> RawName:
        name = super().__new__(cls, "x")
        name.raw = raw
        return name

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


def batch(records: list[tuple[bytes | None, bytes | None, list[tuple[Any, bytes]]]], *, base_offset: int = 0,
          compression: int = 0) -> bytes:
    """A v2 record batch as the broker stores it, with a log header (offset, length) in front."""
    builder = _DefaultRecordBatchBuilderPy(magic=2, compression_type=compression, is_transactional=0,
                                           producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                           batch_size=64 * 1024 * 1024)
    for delta, (key, value, headers) in enumerate(records):
        builder.append(delta, timestamp=1_000 + delta, key=key, value=value, headers=headers)
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    return bytes(data)


def with_codec(data: bytes, compression: int) -> bytes:
    """``data`` claiming another compression codec, its CRC made right again (the broker checked it)."""
    changed = bytearray(data)
    attributes_at, crc_at = 21, 17
    attributes = struct.unpack_from(">h", changed, attributes_at)[0]
    struct.pack_into(">h", changed, attributes_at, (attributes & ~0x07) | compression)
    struct.pack_into(">I", changed, crc_at, calc_crc32c(bytes(changed[attributes_at:])))
    return bytes(changed)


def fetched(data: bytes) -> list[Any]:
    """What the fetcher hands a consumer for a partition's fetched bytes, through the patched reading."""
    partition = PartitionRecords(TP, _Records(data), [], 0, None, None, True, READ_UNCOMMITTED)
    return list(partition)


def test_an_ordinary_batch_reads_as_aiokafka_reads_it() -> None:
    data = batch([(b"k1", b"v1", [("message_id", b"m-1")]), (None, None, []), (b"k3", b"v" * 5000, [])])
    ours = fetched(data)
    theirs = list(PartitionRecords(TP, MemoryRecords(data), [], 0, None, None, True, READ_UNCOMMITTED))
    assert ours == theirs and [r.offset for r in ours] == [0, 1, 2]


def test_a_header_name_that_is_not_utf8_is_kept_and_the_rest_of_the_batch_read() -> None:
    data = batch([(b"a", b"1", []), (b"b", b"2", [(RawName(b"\xff\xfe"), b"x"), ("saga_id", b"s")]), (b"c", b"3", [])],
                 base_offset=40)
    with pytest.raises(UnicodeDecodeError):  # what aiokafka itself does, on every poll
        list(PartitionRecords(TP, MemoryRecords(data), [], 0, None, None, True, READ_UNCOMMITTED))
    records = fetched(data)
    assert [(r.offset, r.key, r.value) for r in records] == [(40, b"a", b"1"), (41, b"b", b"2"), (42, b"c", b"3")]
    name, value = records[1].headers[0]
    assert (raw_header_name(name), value) == (b"\xff\xfe", b"x")
    consumed = ConsumedRecord(topic="t", offset=41, headers=tuple(records[1].headers))
    assert consumed.unreadable == "a header name is not UTF-8 (base64://4=)"
    assert consumed.header("saga_id") == "s"


def test_a_gzip_batch_is_read_with_its_odd_header_name() -> None:
    data = batch([(b"a", b"1" * 1000, [(RawName(b"\x80"), b"x")])], compression=1)
    [record] = fetched(data)
    assert record.value == b"1" * 1000 and raw_header_name(record.headers[0][0]) == b"\x80"


def test_a_decompression_bomb_becomes_one_unreadable_record_and_the_position_moves_past_it() -> None:
    half = bytes(MAX_DECOMPRESSED_BATCH_BYTES // 2)
    bomb = batch([(b"k", half, []), (b"k", half, [])], base_offset=7, compression=1)
    assert len(bomb) < 100_000  # what the broker and the fetch limits see
    after = batch([(b"k", b"next", [])], base_offset=9)
    partition = PartitionRecords(TP, _Records(bomb + after), [], 0, None, None, True, READ_UNCOMMITTED)
    first, second = list(partition)
    assert first.offset == 7 and first.value == bomb and first.key is None
    [(name, reason)] = first.headers
    assert name == UNREADABLE_HEADER and b"offsets 7-8" in reason and b"more than" in reason
    assert (second.offset, second.value) == (9, b"next") and partition.next_fetch_offset == 10
    assert ConsumedRecord(topic="t", headers=tuple(first.headers)).unreadable.startswith(  # type: ignore[union-attr]
        "unreadable record batch at offsets 7-8")


@pytest.mark.parametrize(("codec", "name"), [(2, "snappy"), (3, "lz4"), (4, "zstd")])
def test_a_batch_in_a_codec_that_is_not_installed_or_broken_is_unreadable(codec: int, name: str) -> None:
    data = with_codec(batch([(b"k", b"not really compressed", [])], base_offset=3), codec)
    [record] = fetched(data)
    reason = dict(record.headers)[UNREADABLE_HEADER].decode()
    assert (record.offset == 3 and name in reason) or "broken record" in reason


def test_install_refuses_an_aiokafka_it_was_not_made_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_records, "_installed", False)
    monkeypatch.setattr(aiokafka, "__version__", "0.15.0")
    with pytest.raises(RuntimeError, match=r"aiokafka 0\.15\.0 is not one the record-reading patch was made for"):
        kafka_records.install()
