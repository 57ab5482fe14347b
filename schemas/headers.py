"""Kafka headers of the contract: their names, the one reader and the one writer.

Every header is optional for a client and holds UTF-8 text: ``message_id`` (unique per message; consumers
dedupe on it), ``causation_id`` (the message that caused this one), ``saga_id``, ``saga_type`` and
``traceparent`` (W3C trace context, passed along when valid and dropped otherwise).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

MESSAGE_ID = "message_id"
CAUSATION_ID = "causation_id"
SAGA_ID = "saga_id"
SAGA_TYPE = "saga_type"
TRACEPARENT = "traceparent"
REPLAYED_FROM = "replayed_from"
"""Set on a record ``saga dlq replay`` published again: where its dead letter is."""

HeaderPairs = tuple[tuple[str, bytes | None], ...]
"""Headers as a consumer reads them: (name, raw value) pairs in record order; a name may repeat."""

HeaderValue = bytes | str | None
HeadersArg = Mapping[str, HeaderValue] | Sequence[tuple[str, HeaderValue]] | None
"""Headers in any shape a Kafka client hands them over in."""


def header_pairs(headers: HeadersArg) -> HeaderPairs:
    """Headers as (name, raw bytes) pairs, whatever shape the client handed them over in."""
    if headers is None:
        return ()
    items = headers.items() if isinstance(headers, Mapping) else headers
    return tuple((name, value.encode() if isinstance(value, str) else value) for name, value in items)


def header_text(headers: HeaderPairs, name: str) -> str | None:
    """The header called ``name`` as text, or None when it is absent, has no value or is not UTF-8. A name
    given twice counts with its last value, as Kafka's own ``Headers.lastHeader`` reads it."""
    for key, value in reversed(headers):
        if key == name and value is not None:
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                return None
    return None


def message_headers(message_id: str, *, causation_id: str | None = None, saga_id: str | None = None,
                    saga_type: str | None = None, traceparent: str | None = None) -> dict[str, str]:
    """The headers of a message a service writes: its id, and whichever of the others it has."""
    headers = {MESSAGE_ID: message_id}
    if traceparent:
        headers[TRACEPARENT] = traceparent
    if causation_id:
        headers[CAUSATION_ID] = causation_id
    if saga_id is not None:
        headers[SAGA_ID] = saga_id
    if saga_type:
        headers[SAGA_TYPE] = saga_type
    return headers


def kafka_headers(headers: Mapping[str, str]) -> list[tuple[str, bytes]]:
    """``message_headers`` as a Kafka producer takes them (UTF-8 values), ``message_id`` last."""
    pairs = [(name, str(value).encode()) for name, value in headers.items() if name != MESSAGE_ID]
    if MESSAGE_ID in headers:
        pairs.append((MESSAGE_ID, headers[MESSAGE_ID].encode()))
    return pairs


_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")


def valid_traceparent(value: str | None) -> str | None:
    """A W3C ``traceparent`` header value when it is one (version, trace id, parent id, flags), else None:
    trace context is passed along when usable and dropped otherwise, never a reason to refuse a message."""
    return value if value is not None and _TRACEPARENT.match(value) and not value.startswith("ff") else None
