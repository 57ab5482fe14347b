"""The levers of an outbox row the relay parked for good (``outbox.parked``), as the console pulls them: requeue it
(back into its outbox under its old id, so it is published again, first of its saga's rows) or discard it (deleted
for good; the rows of its saga that waited behind it go on).

A row is named as ``OutboxView`` lists it: its parked table (``<schema>.outbox_parked``) and id. The name is only
looked up among the rows the deployment's parked tables hold (``Reads.parked``), and the table spliced into SQL is
the one that listing read from the catalogue, never the name a request gave.
"""

from __future__ import annotations

from collections.abc import Iterable

import asyncpg

from ..outbox.parked import discard_parked, requeue_parked
from .audit import OperatorAudit
from .ports import OutboxView
from .reads import Reads

REQUEUE = "RequeueParked"
"""The audit's action of a requeue."""
DISCARD = "DiscardParked"
"""The audit's action of a discard."""
PARKED_SUFFIX = "_parked"


class ParkedRowRefused(ValueError):
    """A parked row's lever asked wrongly (a discard without a reason): nothing changed."""


class NotParked(ParkedRowRefused):
    """No such row is parked in an outbox of the deployment (an unknown table or id, or handled meanwhile):
    nothing changed."""


def find(rows: Iterable[OutboxView], table: str, row_id: int) -> OutboxView | None:
    """The parked row ``row_id`` of parked table ``table`` among ``rows``; None when it is not there."""
    return next((row for row in rows if row.table == table and row.row_id == row_id), None)


def outbox_of(row: OutboxView) -> str:
    """The outbox ``row`` was parked from (``<schema>.outbox_parked`` -> ``<schema>.outbox``)."""
    return row.table.removesuffix(PARKED_SUFFIX)


def saga_of(row: OutboxView) -> str | None:
    """The row's message key, its saga (the listing gives it at the head of the reason, ``key: reason``)."""
    key = (row.parked_reason or "").partition(": ")[0]
    return key or None


def why(row: OutboxView) -> str | None:
    """Why the broker refused ``row`` (the listing's reason after its key); None when it says nothing."""
    return (row.parked_reason or "").partition(": ")[2] or None


def anchor(table: str, row_id: int) -> str:
    """The HTML id of a parked row's line on the console's Parked page (its levers)."""
    return f"parked-{table}-{row_id}"


def target(table: str, row_id: int) -> str:
    """What the audit says a parked row's lever was pulled on."""
    return f"parked row {row_id} of {table}"


def discard_confirmation(row: OutboxView) -> str:
    """What discarding ``row`` does and does not undo, for the operator to confirm."""
    saga = saga_of(row)
    return (f"Discard row {row.row_id} of {row.table} for good: its {row.topic} message is deleted and never "
            f"published, and {'saga ' + saga if saga else 'its key'}'s rows that waited behind it are published. "
            "Nothing brings the row back (no requeue after this). It undoes nothing the saga already did and tells "
            "no participant: a command discarded is never carried out, so the saga may wait on it until a lever "
            "moves it.")


async def pull(pool: asyncpg.Pool, reads: Reads, audit: OperatorAudit, operator: str, table: str, row_id: int,
               requeue: bool, reason: str | None) -> str:
    """Requeue (``requeue``) or discard parked row ``row_id`` of parked table ``table`` (as ``Reads.parked`` lists
    it) for ``operator``, and audit it with ``reason``; what was done. NotParked when no such row is parked in an
    outbox of the deployment, ParkedRowRefused for a discard without a reason: nothing changed, the refusal audited."""
    action, reason = REQUEUE if requeue else DISCARD, (reason or "").strip() or None
    row = find(await reads.parked(), table, row_id)
    detail = {"reason": reason, "topic": row.topic if row else None, "saga_id": saga_of(row) if row else None}

    async def refuse(error: ParkedRowRefused) -> ParkedRowRefused:
        await audit.record(operator, action, target(table, row_id), detail, f"refused: {error}")
        return error

    if row is None:
        raise await refuse(NotParked(f"no row {row_id} parked in {table!r}: GET /api/v1/parked lists the parked rows"))
    if not requeue and reason is None:
        raise await refuse(ParkedRowRefused("a discard needs a reason: it deletes the row for good"))
    outbox = outbox_of(row)  # the catalogue's name, never the request's
    if not await (requeue_parked if requeue else discard_parked)(pool, outbox, [row.row_id]):
        raise await refuse(NotParked(f"row {row_id} is no longer parked in {table}: handled meanwhile"))
    done = (f"requeued into {outbox}: published again, ahead of its saga's later rows" if requeue
            else "discarded for good: never published; its saga's later rows go on")
    await audit.record(operator, action, target(table, row_id), detail, done)
    return done
