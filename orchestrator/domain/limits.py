"""What an identifier or a text from outside must satisfy before it reaches a store.

Ids become primary-key columns (a Postgres btree entry holds at most ~2.7 kB) and texts become ``text`` and
``jsonb`` values (neither can hold U+0000). A message that breaks these limits is refused at the door with
a reason; handled any later, its transaction would fail on every redelivery and stall its partition.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MAX_SAGA_ID_BYTES = 512
"""Longest saga id (UTF-8 bytes) a service accepts; derived ids (``{saga_id}:{step}:compensate``,
``...:reply:{attempt}``) add to it."""

MAX_MESSAGE_ID_BYTES = 1024
"""Longest ``message_id`` header (UTF-8 bytes): room for a reply id built on the longest saga id."""


def id_problem(value: str, what: str, limit: int = MAX_SAGA_ID_BYTES) -> str | None:
    """Why ``value`` cannot serve as an identifier (too long, or a NUL), or None when it can.

    An empty id is left to the caller: some contexts allow one, some do not.
    """
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > limit:
        return f"{what} of {size} bytes is longer than the {limit} allowed"
    if "\x00" in value:
        return f"{what} contains a NUL character"
    return None


_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")


def valid_traceparent(value: str | None) -> str | None:
    """A W3C ``traceparent`` header value when it is one (version, trace id, parent id, flags), else None:
    trace context is passed along when usable and dropped otherwise, never a reason to refuse a message."""
    return value if value is not None and _TRACEPARENT.match(value) and not value.startswith("ff") else None


def nul_field(value: Any, path: str = "") -> str | None:
    """The path of the first text holding a NUL character in a decoded record (dicts, lists, dataclass
    fields given as a mapping), or None when there is none."""
    if isinstance(value, str):
        return (path or "value") if "\x00" in value else None
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = nul_field(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None
