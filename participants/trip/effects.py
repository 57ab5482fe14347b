"""What the reference participants actually did, read back from their tables (for tests and verifiers).

Counts are of business rows: ``booked`` / ``charged`` / ``sent`` count every row ever created (a
cancelled booking was booked first), ``cancelled`` / ``refunded`` the rows compensated since.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

import asyncpg


@dataclass(frozen=True)
class _EffectTable:
    participant: str
    table: str
    # count name → predicate over a row; "created" counts are always true
    counts: Mapping[str, Callable[[Mapping[str, Any]], bool]]


def _always(_row: Mapping[str, Any]) -> bool:
    return True


def _status_is(status: str) -> Callable[[Mapping[str, Any]], bool]:
    return lambda row: row["status"] == status


EFFECT_TABLES: tuple[_EffectTable, ...] = (
    _EffectTable("flight", "flight.bookings", {"booked": _always, "cancelled": _status_is("cancelled")}),
    _EffectTable("hotel", "hotel.bookings", {"booked": _always, "cancelled": _status_is("cancelled")}),
    _EffectTable("payment", "payment.charges", {"charged": _always, "refunded": _status_is("refunded")}),
    _EffectTable("notification", "notification.sent", {"sent": _always}),
)


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
    """One participant's business rows and processed commands for one saga."""

    participant: str
    rows: tuple[dict[str, Any], ...] = ()
    processed: tuple[dict[str, Any], ...] = ()
    counts: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "rows": list(self.rows), "processed": list(self.processed)}


@dataclass(frozen=True)
class SagaEffects:
    """Every reference participant's effects for one saga."""

    saga_id: str
    participants: dict[str, ParticipantEffects]

    def count(self, participant: str, what: str) -> int:
        """e.g. ``count("payment", "refunded")``; 0 when the participant or count is unknown."""
        effects = self.participants.get(participant)
        return 0 if effects is None else effects.counts.get(what, 0)

    @property
    def flights_booked(self) -> int:
        return self.count("flight", "booked")

    @property
    def flights_cancelled(self) -> int:
        return self.count("flight", "cancelled")

    @property
    def hotels_booked(self) -> int:
        return self.count("hotel", "booked")

    @property
    def hotels_cancelled(self) -> int:
        return self.count("hotel", "cancelled")

    @property
    def charged(self) -> int:
        return self.count("payment", "charged")

    @property
    def refunded(self) -> int:
        return self.count("payment", "refunded")

    @property
    def sent(self) -> int:
        return self.count("notification", "sent")

    def counts(self) -> dict[str, dict[str, int]]:
        """participant → count name → value."""
        return {name: dict(effects.counts) for name, effects in self.participants.items()}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able view (datetimes as ISO strings, bytes as UTF-8 text or base64)."""
        return {
            "saga_id": self.saga_id,
            "participants": {name: effects.to_dict() for name, effects in self.participants.items()},
        }


async def _exists(conn: asyncpg.Connection, table: str) -> bool:
    return await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table) is True


async def collect_effects(pool: asyncpg.Pool, saga_id: str) -> SagaEffects:
    """Read every reference participant's rows for ``saga_id`` (missing tables read as empty)."""
    participants: dict[str, ParticipantEffects] = {}
    async with pool.acquire() as conn:
        for spec in EFFECT_TABLES:
            if not await _exists(conn, spec.table):
                participants[spec.participant] = ParticipantEffects(
                    spec.participant, counts=dict.fromkeys(spec.counts, 0)
                )
                continue
            rows = await conn.fetch(f"SELECT * FROM {spec.table} WHERE saga_id = $1 ORDER BY 1", saga_id)
            processed_table = f"{spec.participant}.processed_commands"
            processed = (
                await conn.fetch(
                    f"""SELECT idempotency_key, step, kind, action, attempt, status, error_type,
                               error_message, processed_at
                        FROM {processed_table} WHERE saga_id = $1 ORDER BY processed_at""",
                    saga_id,
                )
                if await _exists(conn, processed_table)
                else []
            )
            participants[spec.participant] = ParticipantEffects(
                spec.participant,
                rows=tuple(_row_dict(row) for row in rows),
                processed=tuple(_row_dict(row) for row in processed),
                counts={name: sum(1 for row in rows if test(row)) for name, test in spec.counts.items()},
            )
    return SagaEffects(saga_id, participants)


async def effects_by_idempotency_key_counts(
    pool: asyncpg.Pool, *, only_duplicates: bool = False
) -> dict[str, dict[str, int]]:
    """Business rows per forward idempotency key ``{saga_id}:{step}``, per business table.

    Grouped by (saga_id, step) rather than by the stored key, which is unique per table: a count above 1
    is a double effect, whatever key the duplicate was written under. ``only_duplicates`` keeps those.
    """
    result: dict[str, dict[str, int]] = {}
    having = "HAVING count(*) > 1" if only_duplicates else ""
    async with pool.acquire() as conn:
        for spec in EFFECT_TABLES:
            if not await _exists(conn, spec.table):
                result[spec.table] = {}
                continue
            rows = await conn.fetch(
                f"SELECT saga_id || ':' || step AS key, count(*) AS n FROM {spec.table} GROUP BY 1 {having}"
            )
            result[spec.table] = {row["key"]: row["n"] for row in rows}
    return result
