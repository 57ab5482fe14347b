"""A pinned patch of aiokafka's fetch path, so that no record batch can stop a consumer or exhaust its memory.

aiokafka 0.14 parses a fetched record batch in C and decodes every header name as strict UTF-8. Kafka allows
any bytes there, and a name that is not UTF-8 raises ``UnicodeDecodeError`` out of ``getmany`` on every poll:
the consumer can never read past it (faust's fetcher task dies of it), and the records of other partitions
drained in the same call are lost to a retrying caller. It also decompresses a batch whole, without a bound,
and a batch in a codec whose library is missing raises on every poll too.

``install()`` replaces the ``MemoryRecords`` the fetcher builds from each fetched partition with one whose
batches are read like this:

- an uncompressed batch goes through aiokafka's own C parser (the fast path, nearly every batch); when that
  raises on a header name, the batch is read again by ``_read_records`` here, which keeps a name that is not
  UTF-8 as ``surrogateescape`` text (``raw_header_name`` gives its bytes back);
- a compressed batch is decompressed here with a bound (``MAX_DECOMPRESSED_BATCH_BYTES``; gzip is stopped as
  it passes the bound, the other codecs are measured after aiokafka's decoder) and read by ``_read_records``;
- a batch that cannot be read (over the bound, a codec not installed, a broken record) becomes one record at
  its first offset carrying the batch's bytes as they came from the broker and an ``UNREADABLE_HEADER`` that
  says why. The services dead-letter such a record (``schemas.records.ConsumedRecord.unreadable``), and the
  consumer's position moves past the whole batch.

The patch checks the aiokafka version and the internals it relies on, and refuses to install on others.
"""

from __future__ import annotations

import inspect
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import aiokafka
from aiokafka import codec
from aiokafka.consumer import fetcher
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import _DefaultRecordBatchPy
from aiokafka.record.memory_records import _MemoryRecordsPy
from aiokafka.record.util import decode_varint

from ..schemas.records import UNREADABLE_HEADER

PATCHED_VERSIONS = ("0.14.",)
"""aiokafka versions whose fetcher internals this patch was written and tested against."""

MAX_DECOMPRESSED_BATCH_BYTES = 16 * 1024 * 1024
"""Largest decompressed record batch read (16 MiB); a larger one is passed on as one unreadable record."""

PARTITION_FETCH_BYTES = 2 * 1024 * 1024
"""``max_partition_fetch_bytes`` of every consumer of the services: room for a record at the codec's limit (1 MiB)
with its batch (the broker still returns a larger first batch whole, so nothing stalls)."""

FETCH_MAX_BYTES = 16 * 1024 * 1024
"""``fetch_max_bytes`` of the orchestrator's consumer (aiokafka's default is 50 MiB)."""

_CODEC_NONE, _CODEC_GZIP, _CODEC_SNAPPY, _CODEC_LZ4, _CODEC_ZSTD = 0, 1, 2, 3, 4
_CODEC_NAMES = {_CODEC_GZIP: "gzip", _CODEC_SNAPPY: "snappy", _CODEC_LZ4: "lz4", _CODEC_ZSTD: "zstd"}
_LOG_APPEND_TIME = 1
_installed = False


class UnreadableBatch(Exception):
    """A record batch that cannot be read; the message says why."""


@dataclass(frozen=True, slots=True)
class _Record:
    """What the fetcher reads of a record (the attributes of aiokafka's own)."""

    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)

    @property
    def checksum(self) -> None:
        return None


def raw_header_name(name: str) -> bytes:
    """The bytes a header name had on the wire (names that were not UTF-8 are kept as surrogateescape)."""
    return name.encode("utf-8", "surrogateescape")


def _read_records(batch: _DefaultRecordBatchPy, data: bytes | bytearray | memoryview) -> list[_Record]:
    """The records of ``batch`` (its header already parsed) from its record bytes ``data``, uncompressed.

    The v2 record layout (length, attributes, timestamp delta, offset delta, key, value, headers), as
    aiokafka's parser reads it, except that a header name that is not UTF-8 is kept (surrogateescape).
    """
    buffer = bytes(data)
    pos, records = 0, []
    log_append = batch.timestamp_type == _LOG_APPEND_TIME
    for _ in range(batch._num_records):
        length, pos = decode_varint(buffer, pos)
        end = pos + length
        _, pos = decode_varint(buffer, pos)  # attributes: none defined
        timestamp_delta, pos = decode_varint(buffer, pos)
        offset_delta, pos = decode_varint(buffer, pos)
        key, pos = _bytes(buffer, pos)
        value, pos = _bytes(buffer, pos)
        count, pos = decode_varint(buffer, pos)
        if count < 0:
            raise UnreadableBatch(f"a record has {count} headers")
        headers: list[tuple[str, bytes | None]] = []
        for _ in range(count):
            name, pos = _bytes(buffer, pos)
            if name is None:
                raise UnreadableBatch("a header has no name")
            header_value, pos = _bytes(buffer, pos)
            headers.append((name.decode("utf-8", "surrogateescape"), header_value))
        if pos != end:
            raise UnreadableBatch(f"a record of {length} bytes ends at {pos - end:+d} bytes")
        timestamp = batch.max_timestamp if log_append else batch.first_timestamp + timestamp_delta
        records.append(_Record(batch.base_offset + offset_delta, timestamp, batch.timestamp_type, key, value,
                               headers))
    if pos != len(buffer):
        raise UnreadableBatch(f"{len(buffer) - pos} bytes left after the batch's {batch._num_records} records")
    return records


def _bytes(buffer: bytes, pos: int) -> tuple[bytes | None, int]:
    size, pos = decode_varint(buffer, pos)
    if size < 0:
        return None, pos
    if pos + size > len(buffer):
        raise UnreadableBatch("a record field runs past the end of its batch")
    return buffer[pos:pos + size], pos + size


def _decompress(compression: int, data: memoryview, limit: int) -> bytes:
    """The batch's records, decompressed, at most ``limit`` bytes; UnreadableBatch when larger or when its
    codec is not installed."""
    if compression == _CODEC_GZIP:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            out = inflater.decompress(data, limit + 1)
        except zlib.error as error:
            raise UnreadableBatch(f"gzip batch does not decompress: {error}") from error
        if len(out) > limit or inflater.unconsumed_tail:
            raise UnreadableBatch(f"gzip batch decompresses to more than {limit} bytes")
        return out
    name = _CODEC_NAMES.get(compression)
    if name is None:
        raise UnreadableBatch(f"unknown compression codec {compression}")
    if not getattr(codec, f"has_{name}")():
        raise UnreadableBatch(f"{name} batch, and the {name} codec is not installed (pip install cramjam)")
    try:
        out = getattr(codec, f"{name}_decode")(data.tobytes())
    except Exception as error:  # each codec library raises its own
        raise UnreadableBatch(f"{name} batch does not decompress: {error!r}") from error
    if len(out) > limit:
        raise UnreadableBatch(f"{name} batch decompresses to {len(out)} bytes, over the {limit} allowed")
    return bytes(out)


class _Batch:
    """A v2 record batch as the fetcher uses it: aiokafka's own for its header and (``next``) control records,
    its records read as above."""

    def __init__(self, data: memoryview, fast: Any) -> None:
        self._data = data
        self._fast = fast  # aiokafka's C batch: header fields, CRC check, quick record parsing

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fast, name)

    def validate_crc(self) -> bool:
        return bool(self._fast.validate_crc())

    def __next__(self) -> Any:  # the fetcher reads a control batch's marker this way
        return next(self._fast)

    def __iter__(self) -> Any:
        try:
            return iter(self._records())
        except UnreadableBatch as error:
            return iter([self._unreadable(str(error))])

    def _records(self) -> list[Any]:
        if self._fast.compression_type == _CODEC_NONE:
            try:
                return list(self._fast)
            except (UnicodeDecodeError, CorruptRecordException, ValueError, IndexError):
                pass  # a header name that is not UTF-8, or a broken record: read it here to say which
        slow = _DefaultRecordBatchPy(self._data)  # its header fields; its records are read here
        records = self._data[slow.HEADER_STRUCT.size:]
        if slow.compression_type != _CODEC_NONE:
            records = memoryview(_decompress(slow.compression_type, records, MAX_DECOMPRESSED_BATCH_BYTES))
        try:
            return list(_read_records(slow, records))
        except (ValueError, IndexError, struct.error) as error:
            raise UnreadableBatch(f"broken record: {error!r}") from error

    def _unreadable(self, reason: str) -> _Record:
        first = self._fast.base_offset
        return _Record(first, self._fast.first_timestamp, self._fast.timestamp_type, None, bytes(self._data),
                       [(UNREADABLE_HEADER, f"record batch at offsets {first}-{self._fast.next_offset - 1}: "
                                            f"{reason}".encode())])


class _Records:
    """``MemoryRecords`` for the fetcher: batches split as aiokafka does, v2 batches read by ``_Batch``."""

    _MAGIC_OFFSET = _MemoryRecordsPy.MAGIC_OFFSET

    def __init__(self, data: bytes) -> None:
        self._split = _MemoryRecordsPy(data)

    def size_in_bytes(self) -> int:
        return int(self._split.size_in_bytes())

    def has_next(self) -> bool:
        return bool(self._split.has_next())

    def next_batch(self) -> Any:
        data = self._split._next_slice
        batch = self._split.next_batch()
        if data is not None and data[self._MAGIC_OFFSET] >= 2:
            return _Batch(data, batch)
        return batch  # a legacy (v0/v1) message set: aiokafka's own


def install() -> None:
    """Patch the fetcher of this process (idempotent); RuntimeError on an aiokafka this was not made for."""
    global _installed
    if _installed:
        return
    version = aiokafka.__version__
    if not version.startswith(PATCHED_VERSIONS):
        raise RuntimeError(f"aiokafka {version} is not one the record-reading patch was made for "
                           f"({', '.join(v + 'x' for v in PATCHED_VERSIONS)}): install the version in constraints.txt")
    needed = [(fetcher, "MemoryRecords"), (fetcher.PartitionRecords, "_unpack_records"),
              (_MemoryRecordsPy, "_next_slice"), (_DefaultRecordBatchPy, "HEADER_STRUCT")]
    # orchestrator.consumer.FetchPacing sets these between fetch requests.
    source = inspect.getsource(fetcher.Fetcher.__init__)
    missing_fields = [name for name in ("_fetch_min_bytes", "_fetch_max_wait_ms") if f"self.{name} =" not in source]
    if missing_fields:
        raise RuntimeError(f"aiokafka {version} lacks what the fetch pacing relies on: {missing_fields}")
    probe = _MemoryRecordsPy(b"")
    missing = [name for owner, name in needed if not hasattr(owner, name) and not hasattr(probe, name)]
    if missing:
        raise RuntimeError(f"aiokafka {version} lacks what the record-reading patch relies on: {missing}")
    fetcher.MemoryRecords = _Records
    _installed = True
