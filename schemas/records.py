"""A Kafka record as a service consumed it: where it came from, and its original key, value and headers.

Kept whole, so a record that cannot be handled is dead-lettered with its original bytes.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

from .headers import HeaderPairs, header_text
from .ids import position_id

UNREADABLE_HEADER = "saga-unreadable"
"""Header of the record a consumer passes on in place of a record batch it could not read (over the
decompression bound, a codec not installed, a broken record): its value says why, the record's value holds
the batch's bytes (``infra.kafka_records``)."""


def printable_header_name(name: str) -> str:
    """A header name as text any encoder takes: itself, or ``base64:`` and its raw bytes when it was not UTF-8
    (kept as surrogateescape by the consumer)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "base64:" + base64.b64encode(name.encode("utf-8", "surrogateescape")).decode()
    return name


@dataclass(frozen=True)
class ConsumedRecord:
    """One consumed record; ``partition`` and ``offset`` are -1 for one handed over without a position (a
    direct call rather than a consumer)."""

    topic: str
    partition: int = -1
    offset: int = -1
    key: bytes | None = None
    value: bytes | None = None
    headers: HeaderPairs = ()

    def header(self, name: str) -> str | None:
        """The header called ``name`` as text (``headers.header_text``)."""
        return header_text(self.headers, name)

    @property
    def unreadable(self) -> str | None:
        """Why no service can handle this record whatever its value (None when nothing says so): it stands
        for a batch the consumer could not read, or a header name is not UTF-8."""
        reason = self.header(UNREADABLE_HEADER)
        if reason is not None:
            return f"unreadable {reason}"
        for name, _ in self.headers:
            printable = printable_header_name(name)
            if printable != name:
                return f"a header name is not UTF-8 ({printable})"
        return None

    @property
    def has_position(self) -> bool:
        """True for a record read from a topic (its partition and offset are known)."""
        return self.offset >= 0

    @property
    def position_id(self) -> str:
        """Identity of the record: its place in the log (``ids.position_id``), or for one handed over without
        a position, its topic and a digest of its value (stable across retries of the same call)."""
        if self.has_position:
            return position_id(self.topic, self.partition, self.offset)
        return f"{self.topic}:{hashlib.sha256(self.value or b'').hexdigest()[:32]}"
