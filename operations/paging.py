"""Keyset cursors for the console's long lists (its pages and its API).

A cursor names the last row of a page by its place in the list's order: the sort key and, as the tie-breaker,
the row's id. The next page is the rows after that place, read through an index, so a page costs the same
however deep it is and a row added or removed meanwhile shifts no other row into or out of a page. The cursor
is opaque to its reader (unpadded URL-safe base64 of a JSON array) and carries no filter: the caller sends the
list's criteria again with it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

SORT_KEY_RANGE = (-62_135_596_800_000, 253_402_300_799_999)
"""The sort keys a cursor may hold: epoch milliseconds from year 1 to 9999 (what a timestamp holds; an id too)."""

MAX_CURSOR_CHARS = 2048
"""Longer than any cursor a list gives (a saga id is at most ``MAX_SAGA_ID_BYTES``): a longer one is refused
before it is decoded."""


class BadCursor(ValueError):
    """A cursor that no list gave: the caller's mistake (the API answers 400)."""


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list; ``next_cursor`` reads the next, None when this page is the last."""

    rows: list[T]
    next_cursor: str | None


def encode_cursor(sort_key: int, row_id: str) -> str:
    """The cursor of the place after the row of ``sort_key`` and ``row_id``."""
    text = json.dumps([sort_key, row_id], ensure_ascii=False, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode("utf-8", "surrogatepass")).decode("ascii").rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    """The (sort key, row id) ``encode_cursor`` made ``cursor`` of; BadCursor when it made no such cursor."""
    if len(cursor) > MAX_CURSOR_CHARS:
        raise BadCursor(f"malformed cursor: longer than {MAX_CURSOR_CHARS} characters; use the cursor a page gave")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = json.loads(raw.decode("utf-8", "surrogatepass"))
    except (binascii.Error, ValueError):  # not base64, not UTF-8, not JSON (all ValueErrors)
        raise BadCursor("malformed cursor: not one a page of this list gave") from None
    if (not isinstance(key, list) or len(key) != 2 or type(key[0]) is not int or not isinstance(key[1], str)
            or not SORT_KEY_RANGE[0] <= key[0] <= SORT_KEY_RANGE[1] or "\x00" in key[1]):
        raise BadCursor("malformed cursor: not one a page of this list gave")
    return key[0], key[1]


def page_of(rows: list[T], limit: int, key: Callable[[T], tuple[int, str]]) -> Page[T]:
    """The first ``limit`` of ``rows``, read with one row more than ``limit`` to know whether a next page exists;
    ``key``: a row's (sort key, id), of which the next cursor is made."""
    shown = rows[:limit]
    return Page(shown, encode_cursor(*key(shown[-1])) if len(rows) > limit and shown else None)
