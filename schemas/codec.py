"""Avro single-object encoding: framing, CRC-64-AVRO fingerprints (fastavro's) and the wire errors.

A single-object encoded value is ``C3 01`` + the 8-byte little-endian CRC-64-AVRO fingerprint of the
writer schema's Parsing Canonical Form + the Avro binary body (Avro specification, "Single-object
encoding"). Everything here is pure: no schema files are read by this module.
"""

from __future__ import annotations

import fastavro.schema

MARKER = b"\xc3\x01"
"""The two-byte marker that starts every single-object encoded value."""

FINGERPRINT_SIZE = 8
HEADER_SIZE = len(MARKER) + FINGERPRINT_SIZE


def fingerprint_of(canonical_form: str) -> bytes:
    """The 8 fingerprint bytes of a schema given in Parsing Canonical Form, in the order the header carries them.

    fastavro's CRC-64-AVRO hex string is already that (little-endian) order; a client that builds the header
    itself takes ``bytes.fromhex`` of it as well (docs/starting.md), never ``struct.pack`` of it as a number.
    """
    return bytes.fromhex(fastavro.schema.fingerprint(canonical_form, "CRC-64-AVRO"))


def header_for(fingerprint: bytes) -> bytes:
    """The 10-byte single-object header for a writer schema fingerprint."""
    if len(fingerprint) != FINGERPRINT_SIZE:
        raise ValueError(f"a fingerprint has {FINGERPRINT_SIZE} bytes, got {len(fingerprint)}")
    return MARKER + fingerprint


def split_header(data: bytes) -> bytes:
    """Check the marker and return the writer fingerprint; the body starts at ``HEADER_SIZE``."""
    if len(data) < HEADER_SIZE or data[:2] != MARKER:
        raise NotSingleObject(data)
    return bytes(data[2:HEADER_SIZE])


class WireError(ValueError):
    """A value could not be encoded or decoded; ``reason`` says why in words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotSingleObject(WireError):
    """The bytes do not start with the single-object marker and a full fingerprint."""

    def __init__(self, data: bytes) -> None:
        start = bytes(data[:2]).hex() or "nothing"
        super().__init__(
            f"not an Avro single-object value: {len(data)} bytes starting with {start} "
            f"(expected marker c301 and an {FINGERPRINT_SIZE}-byte fingerprint)"
        )


class UnknownFingerprint(WireError):
    """No known writer schema has the fingerprint in the header."""

    def __init__(self, fingerprint: bytes) -> None:
        super().__init__(f"unknown writer schema fingerprint {fingerprint.hex()}")
        self.fingerprint = fingerprint


class UnknownSchemaName(WireError):
    """A full schema name that the registry does not hold."""

    def __init__(self, full_name: str) -> None:
        super().__init__(f"unknown schema {full_name!r}")
        self.full_name = full_name


class WrongSchema(WireError):
    """The value was written with a schema other than the ones the caller accepts."""

    def __init__(self, actual: str, expected: frozenset[str]) -> None:
        wanted = ", ".join(sorted(expected)) or "nothing"
        super().__init__(f"value written as {actual}, expected {wanted}")
        self.actual = actual
        self.expected = expected


class MalformedBody(WireError):
    """The header was fine but the Avro body is not a valid value of the writer schema."""


class ValueTooLarge(WireError):
    """The value exceeds the configured size limit."""

    def __init__(self, size: int, limit: int, what: str) -> None:
        super().__init__(f"{what} of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class InvalidRecord(WireError):
    """A record to encode does not match its schema (missing, extra or mistyped field)."""


__all__ = [
    "FINGERPRINT_SIZE",
    "HEADER_SIZE",
    "MARKER",
    "InvalidRecord",
    "MalformedBody",
    "NotSingleObject",
    "UnknownFingerprint",
    "UnknownSchemaName",
    "ValueTooLarge",
    "WireError",
    "WrongSchema",
    "fingerprint_of",
    "header_for",
    "split_header",
]
