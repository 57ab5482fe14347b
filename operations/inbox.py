"""What needs a human, in one list: sagas that ended FAILED or COMPENSATION_FAILED, quarantined ones, wedged ones,
compensations retrying for long, outbox rows parked for good, commands deferred to a person, dead letters neither
replayed nor dismissed (from the orchestrator's dead-letter index), and participants whose commands wait with no
worker consuming them (from the console's attendance snapshot, ``operations.attendance``).

The inbox is derived from current state on every read (nothing is stored for it), so an item leaves it only when
what made it one is handled: the saga is redriven, released, resumed or terminated, the row requeued (published
again) or discarded, the command answered, the letter replayed or dismissed, a worker started. There is no age
cutoff: a saga that ended FAILED a month ago is still listed.

"Stuck since" is how long an item has been as it is. For a saga it is its read-model row's ``updated_at`` (the
last event recorded for it: when it ended, was quarantined, or its step last failed), the best the read model
has; for a parked row when it was written, for a deferred command when it was deferred, for a dead letter when its
record failed, for a command topic no worker consumes when the snapshot first saw it so. Items come oldest first,
paged by an opaque cursor of (stuck since, item id).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from ..client.api import saga_segment
from ..orchestrator.domain.model import SagaStatus
from ..orchestrator.ports import DeadLetterIndex, IndexedLetter, SagaSummaryRow
from ..schemas.message_types import RELEASE, RESUME, Lever
from . import paging, parked_rows
from .attendance import AttendanceSnapshot, CommandTopic
from .ports import OutboxView, StuckQuery
from .reads import Deferred, Reads

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MIN_FAILURES = 3
"""A running saga whose current step failed this often is wedged; a compensating one, retrying for long (the
wedged page's default)."""


class Kind(StrEnum):
    """What kind of trouble an item is."""

    FAILED = "failed"  # a saga ended FAILED (after its pivot, or its failure mode did not compensate)
    COMPENSATION_FAILED = "compensation_failed"  # its undoing stopped on a compensation failed for good
    QUARANTINED = "quarantined"  # a message for it failed in a way no retry mends
    WEDGED = "wedged"  # running, its current step failed at least MIN_FAILURES times
    COMPENSATION_RETRYING = "compensation_retrying"  # compensating, a compensation failed at least MIN_FAILURES times
    PARKED = "parked"  # an outbox row the broker refused for good
    DEFERRED = "deferred"  # a command a participant deferred to a person
    DEAD_LETTER = "dead_letter"  # a record on saga.dlq no operator has replayed or dismissed yet
    UNATTENDED = "unattended"  # commands wait on a participant's topic and no worker consumes it


SAGA_KINDS = {Kind.FAILED: SagaStatus.FAILED, Kind.COMPENSATION_FAILED: SagaStatus.COMPENSATION_FAILED,
              Kind.QUARANTINED: SagaStatus.QUARANTINED}
"""The kinds that are a saga's state: every saga in it is an item."""
_WEDGED_STATUSES = tuple(s.value for s in SagaStatus
                         if not s.is_terminal and s not in (SagaStatus.QUARANTINED, SagaStatus.COMPENSATING))


class InboxError(ValueError):
    """A query asked wrongly: an unknown kind (a bad cursor is ``paging.BadCursor``)."""


@dataclass(frozen=True)
class Link:
    """What handles an item: ``label`` (the lever's name, e.g. "Release", or what the page does) at ``href``."""

    label: str
    href: str


@dataclass(frozen=True)
class InboxItem:
    """One thing that needs a human. ``item_id``: the saga id for a saga, else the row's or command's own id."""

    kind: Kind
    item_id: str
    saga_id: str | None
    saga_type: str | None
    what: str
    stuck_since_ms: int
    levers: tuple[Link, ...] = ()

    @property
    def key(self) -> tuple[int, str]:
        return (self.stuck_since_ms, self.item_id)


@dataclass(frozen=True)
class InboxQuery:
    """Which items: of ``kinds`` (all when empty), of ``saga_type``, stuck since at or after ``since_ms`` and
    before ``before_ms``; after ``cursor``; at most ``limit``."""

    kinds: frozenset[Kind] = frozenset()
    saga_type: str | None = None
    since_ms: int | None = None
    before_ms: int | None = None
    cursor: str | None = None
    limit: int = DEFAULT_LIMIT
    min_failures: int = MIN_FAILURES

    def takes(self, kind: Kind) -> bool:
        return not self.kinds or kind in self.kinds


@dataclass(frozen=True)
class InboxPage:
    items: list[InboxItem] = field(default_factory=list)
    next_cursor: str | None = None  # None: this is the last page


def kinds_of(names: Sequence[str]) -> frozenset[Kind]:
    """The kinds named (a kind, or a saga state such as FAILED, in any case); InboxError for another name."""
    found = set()
    for name in (n.strip().lower() for n in names if n.strip()):
        try:
            found.add(Kind(name))
        except ValueError:
            raise InboxError(f"no inbox kind {name!r}; one of {', '.join(k.value for k in Kind)}") from None
    return frozenset(found)


def moment_ms(moment: datetime | None) -> int | None:
    """``moment`` in epoch milliseconds (UTC when it names no zone); None for None."""
    if moment is None:
        return None
    return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp() * 1000)


def parse_moment_ms(moment: str | None) -> int | None:
    """Epoch milliseconds of an ISO 8601 time (UTC when it has no offset), or of a number of epoch milliseconds;
    None for None or ""; ValueError for anything else."""
    if not moment or not moment.strip():
        return None
    text = moment.strip()
    return int(text) if text.isdigit() else moment_ms(datetime.fromisoformat(text))


def _saga_page(saga_id: str) -> str:
    return f"/sagas/{saga_segment(saga_id)}"


def saga_item(row: SagaSummaryRow, min_failures: int = MIN_FAILURES) -> InboxItem | None:
    """The item of a saga's read-model row; None when nothing in it needs a human."""
    page = _saga_page(row.saga_id)
    status = row.status

    def lever(action: str) -> Link:
        return Link(action, f"{page}#levers")

    if status == SagaStatus.FAILED:
        kind, what = Kind.FAILED, f"failed at {row.failed_step or '?'}: {row.reason or row.last_error or 'no reason'}"
        levers: tuple[Link, ...] = (lever(Lever.REDRIVE), lever(Lever.FORCE_COMPENSATE), lever(Lever.TERMINATE))
    elif status == SagaStatus.COMPENSATION_FAILED:
        kind, what = Kind.COMPENSATION_FAILED, (f"compensation of {row.failed_step or row.current_step or '?'}"
                                                f" failed: {row.reason or row.last_error or 'no reason'}")
        levers = (lever(RESUME), lever(Lever.TERMINATE))
    elif status == SagaStatus.QUARANTINED:
        kind, what, levers = Kind.QUARANTINED, f"quarantined: {row.reason or 'no reason'}", (lever(RELEASE),)
    elif row.step_failures >= min_failures and status == SagaStatus.COMPENSATING:
        kind, what = Kind.COMPENSATION_RETRYING, (f"compensation of {row.current_step} failed {row.step_failures}"
                                                  f" times ({row.last_error or 'no error'}), still retrying")
        levers = (lever(Lever.RETRY_NOW), lever(Lever.TERMINATE))
    elif row.step_failures >= min_failures and status in _WEDGED_STATUSES:
        kind, what = Kind.WEDGED, (f"{row.current_step} failed {row.step_failures} times"
                                   f" ({row.last_error or 'no error'})")
        levers = (lever(Lever.RETRY_NOW), lever(Lever.SKIP), lever(Lever.FORCE_COMPENSATE))
    else:
        return None
    return InboxItem(kind, row.saga_id, row.saga_id, row.saga_type, what, row.updated_at_ms,
                     (Link("open", page), *levers))


def parked_item(row: OutboxView) -> InboxItem:
    """A parked outbox row's item, linked to its line on the Parked page, where its levers are (Requeue: published
    again; Discard: deleted for good). Its saga is its message key (read from the row's reason, ``key: reason``)."""
    reason = parked_rows.why(row)
    saga_id = parked_rows.saga_of(row)
    links = (Link("open", _saga_page(saga_id)),) if saga_id else ()
    line = f"/parked#{parked_rows.anchor(row.table, row.row_id)}"
    return InboxItem(Kind.PARKED, f"parked:{row.table}:{row.row_id:020d}", saga_id, None,
                     f"{row.topic} row {row.row_id} in {row.table} refused for good: {reason or 'no reason'}",
                     row.created_at_ms, (Link("requeue", line), Link("discard", line), *links))


def deferred_item(command: Deferred) -> InboxItem:
    return InboxItem(Kind.DEFERRED, f"deferred:{command.participant}:{command.idempotency_key}", command.saga_id,
                     None, f"{command.participant} waits for a person's answer to {command.action}"
                     f" ({command.step})", command.deferred_at_ms,
                     (Link("answer", "/deferred"), Link("open", _saga_page(command.saga_id))))


LETTER_ITEM = "dead-letter:"
"""A dead letter's item id: this, then its position on saga.dlq zero-padded (``dead-letter:P:O``), so that ids
sort as positions do."""


def letter_item(letter: IndexedLetter) -> InboxItem:
    """A dead letter's item: what failed and why, linked to the dead-letters page filtered to it."""
    position = f"{letter.partition}:{letter.offset}"
    links = (Link("open", _saga_page(letter.saga_id)),) if letter.saga_id else ()
    what = (f"{letter.source_topic} record dead-lettered: {letter.reason or 'no reason'}" if letter.source_topic
            else "a record on saga.dlq that is no readable letter")
    return InboxItem(Kind.DEAD_LETTER, f"{LETTER_ITEM}{letter.partition:010d}:{letter.offset:020d}", letter.saga_id,
                     None, what, letter.failed_at_ms,
                     (Link("dead letter", f"/dead-letters?position={position}"), *links))


def unattended_item(topic: CommandTopic) -> InboxItem:
    """An unattended command topic's item, stuck since the snapshot first saw it so."""
    return InboxItem(Kind.UNATTENDED, f"unattended:{topic.participant}", None, None, topic.describe(),
                     topic.unattended_since_ms or 0,
                     (Link("running sagas", "/sagas?status=RUNNING"), Link("wedged steps", "/wedged")))


def letters_after(cursor: str | None) -> tuple[int, int, int] | None:
    """Where the index's letters not handled resume after ``cursor``: past its letter when it is one, else every
    letter that failed at or after its time (``assemble`` drops those before it)."""
    if cursor is None:
        return None
    at, item_id = paging.decode_cursor(cursor)
    if item_id.startswith(LETTER_ITEM):
        partition, _, offset = item_id.removeprefix(LETTER_ITEM).partition(":")
        return (at, int(partition), int(offset))
    return (at - 1, 2**31, 2**62)


def _within(item: InboxItem, query: InboxQuery, after: tuple[int, str] | None) -> bool:
    return (query.takes(item.kind)
            and (query.saga_type is None or item.saga_type == query.saga_type)
            and (query.since_ms is None or item.stuck_since_ms >= query.since_ms)
            and (query.before_ms is None or item.stuck_since_ms < query.before_ms)
            and (after is None or item.key > after))


def assemble(sagas: Sequence[SagaSummaryRow], parked: Sequence[OutboxView], deferred: Sequence[Deferred],
             query: InboxQuery, letters: Sequence[IndexedLetter] = (),
             unattended: Sequence[CommandTopic] = ()) -> InboxPage:
    """The page ``query`` asks for, from its candidates: the sagas the store found after the cursor (at most
    ``query.limit + 1``, in (updated_at, id) order: every saga the page can hold), every parked row and deferred
    command, the dead letters the index found (as many as the page can hold, oldest first) and the unattended
    command topics. A parked row, deferred command, dead letter or topic has no saga type here: a saga type filter
    leaves them out."""
    after = paging.decode_cursor(query.cursor) if query.cursor else None
    candidates = [item for item in (saga_item(row, query.min_failures) for row in sagas) if item is not None]
    candidates += [parked_item(row) for row in parked] + [deferred_item(command) for command in deferred]
    candidates += [letter_item(letter) for letter in letters]
    candidates += [unattended_item(topic) for topic in unattended]
    found = sorted((item for item in candidates if _within(item, query, after)), key=lambda item: item.key)
    shown = found[:query.limit]
    more = len(found) > query.limit
    return InboxPage(shown, paging.encode_cursor(*shown[-1].key) if more and shown else None)


def stuck_query(query: InboxQuery) -> StuckQuery:
    """What the store is asked for the saga kinds ``query`` takes."""
    failing = (_WEDGED_STATUSES if query.takes(Kind.WEDGED) else ()) + (
        (SagaStatus.COMPENSATING.value,) if query.takes(Kind.COMPENSATION_RETRYING) else ())
    return StuckQuery(statuses=tuple(s.value for k, s in SAGA_KINDS.items() if query.takes(k)), failing=failing,
                      min_failures=query.min_failures, saga_type=query.saga_type, since_ms=query.since_ms,
                      before_ms=query.before_ms, after=paging.decode_cursor(query.cursor) if query.cursor else None)


async def inbox(reads: Reads, query: InboxQuery, dead_letters: DeadLetterIndex | None = None,
                attendance: AttendanceSnapshot | None = None) -> InboxPage:
    """One page of the inbox: what ``query`` takes, stuck longest first (dead letters too, given their index;
    unattended command topics too, given the attendance snapshot). ``paging.BadCursor`` for a bad cursor."""
    stuck = stuck_query(query)
    untyped = query.saga_type is None  # parked rows, deferred commands and letters have no saga type here

    async def none() -> list[Any]:
        return []

    # The reads are independent: asked at once, a page waits for the slowest, not for their sum.
    sagas, parked, deferred, letters = await asyncio.gather(
        reads.store.stuck_sagas(stuck, query.limit + 1) if stuck.statuses or stuck.failing else none(),
        reads.parked() if query.takes(Kind.PARKED) and untyped else none(),
        reads.deferred() if query.takes(Kind.DEFERRED) and untyped else none(),
        dead_letters.unhandled(letters_after(query.cursor), query.since_ms, query.before_ms, query.limit + 1)
        if dead_letters is not None and query.takes(Kind.DEAD_LETTER) and untyped else none())
    unattended = (attendance.unattended() if attendance is not None and query.takes(Kind.UNATTENDED)
                  and query.saga_type is None else [])
    return assemble(sagas, parked, deferred, query, letters, unattended)


COUNTED_UP_TO = MAX_LIMIT
"""The most items the navigation's count counts; more shows as that many and a "+"."""


@dataclass(frozen=True)
class Count:
    """How many items the inbox lists: ``items`` (at most ``COUNTED_UP_TO``), and whether there are ``more``."""

    items: int
    more: bool = False

    def __str__(self) -> str:
        return f"{self.items}+" if self.more else str(self.items)


async def count(reads: Reads, dead_letters: DeadLetterIndex | None = None,
                attendance: AttendanceSnapshot | None = None) -> Count:
    """How many items ``inbox`` lists (every kind, one read of each as a page of it does, so the count and the
    list never disagree), counted up to ``COUNTED_UP_TO``: the navigation's badge."""
    page = await inbox(reads, InboxQuery(limit=COUNTED_UP_TO), dead_letters, attendance)
    return Count(len(page.items), page.next_cursor is not None)
