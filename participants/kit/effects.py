"""Where a participant's business effects show, as it declares them, and the one reader of them.

A participant names the table its effects are rows of and how to count them (``EffectTable``): each count is a
condition on a row (``None``: every row), and each action says which count its effect adds to. From that alone
``saga effects`` prints what a saga left behind, ``saga verify`` checks it against how the saga ended (a step
that succeeded holds its effect once, a compensated one is undone, ...), and finds effects recorded twice for
one step: for any saga type, with no code of its own.

    flight = participant("flight", tables=[...], effects=EffectTable(
        "bookings", counts={"booked": None, "cancelled": "status = 'cancelled'"}))

    @flight.action(effect="booked")
    async def book_flight(...): ...

    @book_flight.undo(effect="cancelled")
    async def cancel_flight(...): ...

A row of the table belongs to a saga by its ``saga_column`` and to a step by its ``step_column``: two rows for
one (saga, step) are a double effect (the forward row is created once per step; its undoing updates it).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from typing import Any, Protocol

import asyncpg

__all__ = ["EffectTable", "ParticipantEffects", "SagaEffects", "count_effects", "duplicate_effects", "read_effects"]


@dataclass(frozen=True)
class EffectTable:
    """A participant's business table and its effect counts.

    ``table``: the table, qualified (``flight.bookings``) or in the participant's schema (``bookings``);
    ``counts``: count name → SQL condition over one of its rows (``None``: every row), e.g.
    ``{"booked": None, "cancelled": "status = 'cancelled'"}``; ``actions``: action → the count its effect
    adds to (the decorators' ``effect=`` fill it in); ``saga_column`` and ``step_column``: the columns holding
    a row's saga id and step name.
    """

    table: str
    counts: Mapping[str, str | None]
    actions: Mapping[str, str] = field(default_factory=dict)
    saga_column: str = "saga_id"
    step_column: str = "step"

    def __post_init__(self) -> None:
        unknown = {action: count for action, count in self.actions.items() if count not in self.counts}
        if unknown:
            raise ValueError(f"effect table {self.table}: actions {unknown} name counts it does not have "
                             f"(it counts {', '.join(self.counts) or 'nothing'})")

    def in_schema(self, schema: str) -> EffectTable:
        """The same declaration with its table qualified by ``schema`` (kept when already qualified)."""
        return self if "." in self.table else replace(self, table=f"{schema}.{self.table}")


class DeclaresEffects(Protocol):
    """What the readers ask of a participant (the kit's ``Participant``)."""

    @property
    def name(self) -> str: ...

    @property
    def schema(self) -> str: ...

    @property
    def effects(self) -> EffectTable | None: ...


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return base64.b64encode(value).decode()
    return value


def _row_dict(record: asyncpg.Record) -> dict[str, Any]:
    return {key: _jsonable(value) for key, value in record.items()}


@dataclass(frozen=True)
class ParticipantEffects:
    """One participant's business rows and handled commands for one saga, and its effect counts."""

    participant: str
    rows: tuple[dict[str, Any], ...] = ()
    processed: tuple[dict[str, Any], ...] = ()
    counts: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "rows": list(self.rows), "processed": list(self.processed)}


@dataclass(frozen=True)
class SagaEffects:
    """Every declaring participant's effects for one saga."""

    saga_id: str
    participants: dict[str, ParticipantEffects]

    def count(self, participant: str, what: str) -> int:
        """e.g. ``count("payment", "refunded")``; 0 when the participant or count is unknown."""
        effects = self.participants.get(participant)
        return 0 if effects is None else effects.counts.get(what, 0)

    def counts(self) -> dict[str, dict[str, int]]:
        """participant → count name → value."""
        return {name: dict(effects.counts) for name, effects in self.participants.items()}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able view (datetimes as ISO strings, bytes as UTF-8 text or base64)."""
        return {"saga_id": self.saga_id,
                "participants": {name: effects.to_dict() for name, effects in self.participants.items()}}


def _declared(participants: Iterable[DeclaresEffects]) -> list[tuple[DeclaresEffects, EffectTable]]:
    return [(participant, participant.effects.in_schema(participant.schema))
            for participant in participants if participant.effects is not None]


async def _exists(conn: asyncpg.Connection, table: str) -> bool:
    return await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table) is True


def _count_sql(counts: Mapping[str, str | None]) -> str:
    return ", ".join(f"count(*) FILTER (WHERE {condition or 'true'}) AS \"{name}\"" for name, condition in
                     counts.items())


async def _counts(conn: asyncpg.Connection, table: EffectTable, saga_id: str) -> dict[str, int]:
    counted = await conn.fetchrow(f"SELECT {_count_sql(table.counts)} FROM {table.table} "
                                  f"WHERE {table.saga_column} = $1", saga_id)
    return {name: int(counted[name]) for name in table.counts} if counted else dict.fromkeys(table.counts, 0)


async def count_effects(pool: asyncpg.Pool, participants: Iterable[DeclaresEffects], saga_id: str
                        ) -> dict[str, dict[str, int]]:
    """participant → count name → value for ``saga_id``: what ``saga verify`` compares (one query a table)."""
    found: dict[str, dict[str, int]] = {}
    async with pool.acquire() as conn:
        for participant, table in _declared(participants):
            exists = await _exists(conn, table.table)
            found[participant.name] = await _counts(conn, table, saga_id) if exists else dict.fromkeys(table.counts, 0)
    return found


async def read_effects(pool: asyncpg.Pool, participants: Iterable[DeclaresEffects], saga_id: str) -> SagaEffects:
    """Each declaring participant's rows, handled commands and counts for ``saga_id`` (a table not made yet
    reads as empty): what ``saga effects`` shows."""
    found: dict[str, ParticipantEffects] = {}
    async with pool.acquire() as conn:
        for participant, table in _declared(participants):
            if not await _exists(conn, table.table):
                found[participant.name] = ParticipantEffects(participant.name, counts=dict.fromkeys(table.counts, 0))
                continue
            rows = await conn.fetch(f"SELECT * FROM {table.table} WHERE {table.saga_column} = $1 ORDER BY 1", saga_id)
            processed_table = f"{participant.schema}.processed_commands"
            processed = await conn.fetch(
                f"""SELECT idempotency_key, step, kind, action, attempt, status, error_type, error_message,
                           processed_at
                    FROM {processed_table} WHERE saga_id = $1 ORDER BY processed_at""",
                saga_id) if await _exists(conn, processed_table) else []
            found[participant.name] = ParticipantEffects(
                participant.name, rows=tuple(_row_dict(row) for row in rows),
                processed=tuple(_row_dict(row) for row in processed), counts=await _counts(conn, table, saga_id))
    return SagaEffects(saga_id, found)


async def duplicate_effects(pool: asyncpg.Pool, participants: Iterable[DeclaresEffects], *,
                            only_duplicates: bool = True) -> dict[str, dict[str, int]]:
    """Business rows per ``{saga_id}:{step}``, per declared table; ``only_duplicates`` keeps those above 1.

    Grouped by (saga, step) rather than by a stored key, which is unique per table anyway: a count above 1 is
    a double effect, whatever key the duplicate was written under.
    """
    result: dict[str, dict[str, int]] = {}
    having = "HAVING count(*) > 1" if only_duplicates else ""
    async with pool.acquire() as conn:
        for _, table in _declared(participants):
            if not await _exists(conn, table.table):
                result[table.table] = {}
                continue
            rows = await conn.fetch(f"SELECT {table.saga_column} || ':' || {table.step_column} AS key, count(*) AS n"
                                    f" FROM {table.table} GROUP BY 1 {having}")
            result[table.table] = {row["key"]: row["n"] for row in rows}
    return result
