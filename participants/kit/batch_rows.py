"""For batch handlers: the business rows of many commands in one statement instead of one per command.

``record_calls`` is the common body of a typed batch action (``many=True``), ``record_each`` of a kit batch
handler; both rest on ``insert_rows``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import asyncpg
import orjson
from pydantic import BaseModel

from .outcome import Failed, Outcome, Proceed, ReceivedCommand, Succeeded, Verdict
from .participant import Call
from .typed import Calling

OutputT = TypeVar("OutputT", bound=BaseModel)


async def insert_rows(conn: asyncpg.Connection, table: str, columns: Mapping[str, str],
                      rows: Sequence[Sequence[Any]], returning: str) -> dict[str, Any]:
    """Insert ``rows`` into ``table`` in one statement and return each row's ``returning`` column by its
    ``idempotency_key``.

    ``columns`` maps each column name to its Postgres type, in the order of a row's values, and must
    include ``idempotency_key`` (unique per command, so it identifies the row it returns).
    """
    if "idempotency_key" not in columns:
        raise ValueError("insert_rows needs an idempotency_key column to match the rows it returns")
    if not rows:
        return {}
    arrays = ", ".join(f"${index}::{kind}[]" for index, kind in enumerate(columns.values(), start=1))
    records = await conn.fetch(
        f"INSERT INTO {table} ({', '.join(columns)}) SELECT * FROM unnest({arrays})"
        f" RETURNING idempotency_key, {returning}",
        *([row[index] for row in rows] for index in range(len(columns))),
    )
    return {record["idempotency_key"]: record[returning] for record in records}


Row = Callable[[ReceivedCommand, Mapping[str, Any]], Sequence[Any]]


async def record_each(conn: asyncpg.Connection, calls: Sequence[Call], verdicts: Sequence[Verdict], table: str,
                      columns: Mapping[str, str], row: Row, returning: str) -> list[Outcome]:
    """The common batch handler: every call whose business rule said ``Proceed`` gets a row (``row`` gives
    its values in ``columns`` order), all inserted in one statement, and succeeds with ``{returning: value}``
    as its output; the others fail as their verdict says."""
    rows = [row(command, saga_input) for (command, saga_input), verdict in zip(calls, verdicts, strict=True)
            if isinstance(verdict, Proceed)]
    inserted = await insert_rows(conn, table, columns, rows, returning)
    return [Succeeded(orjson.dumps({returning: inserted[command.idempotency_key]}),
                      reply_delay_ms=verdict.reply_delay_ms) if isinstance(verdict, Proceed) else verdict
            for (command, _), verdict in zip(calls, verdicts, strict=True)]


async def record_calls(tx: asyncpg.Connection, calls: Sequence[Calling[Any]], verdicts: Sequence[Verdict],
                       table: str, columns: Mapping[str, str], row: Callable[[Calling[Any]], Sequence[Any]],
                       output: type[OutputT]) -> list[OutputT | Failed]:
    """The common typed batch action: every call whose business rule said ``Proceed`` gets a row (``row`` gives
    its values in ``columns`` order), all inserted in one statement, and succeeds with ``output``, the model of
    one field: the new row's column of that name (``FlightBooking(booking_id=...)``); the others fail as their
    verdict says. A ``Proceed``'s ``reply_delay_ms`` holds its reply."""
    [returning] = output.model_fields
    rows = [row(call) for call, verdict in zip(calls, verdicts, strict=True) if isinstance(verdict, Proceed)]
    inserted = await insert_rows(tx, table, columns, rows, returning)
    results: list[OutputT | Failed] = []
    for call, verdict in zip(calls, verdicts, strict=True):
        if isinstance(verdict, Failed):
            results.append(verdict)
            continue
        if verdict.reply_delay_ms:
            call.step.hold_reply(verdict.reply_delay_ms)
        results.append(output.model_validate({returning: inserted[call.step.idempotency_key]}))
    return results
