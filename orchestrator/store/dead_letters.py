"""The ``DeadLetterIndex`` over the orchestrator's schema (``PostgresDeadLetterIndex``, tables ``dead_letters`` and
``dead_letter_positions``, migrations 015 and 016) and in memory (``MemoryDeadLetterIndex``, for tests and demos)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

import asyncpg

from ...infra.db import check_identifier
from ..ports import IndexedLetter, LetterFilter

_COLUMNS = ("dlq_partition, dlq_offset, written_at_ms, failed_at_ms, saga_id, source_topic, reason, record,"
            " replayed_at_ms, dismissed_at_ms, dismissed_by, dismiss_reason")
_KEPT = ("dlq_partition, dlq_offset, written_at_ms, failed_at_ms, saga_id, source_topic, reason, record,"
         " replayed_at_ms")


def passes(letter: IndexedLetter, where: LetterFilter) -> bool:
    """Whether ``letter`` passes ``where`` (what the Postgres adapter's WHERE clause says, in Python)."""
    return ((where.saga_id is None or letter.saga_id == where.saga_id)
            and (where.source is None or letter.source_topic == where.source)
            and (where.reason is None or (letter.reason is not None
                                          and where.reason.lower() in letter.reason.lower()))
            and (where.since_ms is None or letter.failed_at_ms >= where.since_ms))


def _key(letter: IndexedLetter) -> tuple[int, int, int]:
    return (letter.failed_at_ms, letter.partition, letter.offset)


def _letter(row: asyncpg.Record) -> IndexedLetter:
    return IndexedLetter(row["dlq_partition"], row["dlq_offset"], row["written_at_ms"], row["failed_at_ms"],
                         row["saga_id"], row["source_topic"], row["reason"],
                         None if row["record"] is None else bytes(row["record"]), row["replayed_at_ms"],
                         row["dismissed_at_ms"], row["dismissed_by"], row["dismiss_reason"])


class PostgresDeadLetterIndex:
    """``DeadLetterIndex`` on ``<schema>.dead_letters``."""

    def __init__(self, pool: asyncpg.Pool, schema: str = "saga") -> None:
        self._pool = pool
        self._s = check_identifier(schema)

    async def positions(self) -> dict[int, int]:
        rows = await self._pool.fetch(f"SELECT dlq_partition, next_offset FROM {self._s}.dead_letter_positions")
        return {row["dlq_partition"]: row["next_offset"] for row in rows}

    async def record(self, letters: Sequence[IndexedLetter], positions: Mapping[int, int]) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            if letters:
                await conn.executemany(
                    f"INSERT INTO {self._s}.dead_letters ({_KEPT}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
                    " ON CONFLICT (dlq_partition, dlq_offset) DO NOTHING",
                    [(x.partition, x.offset, x.written_at_ms, x.failed_at_ms, x.saga_id, x.source_topic, x.reason,
                      x.record, x.replayed_at_ms) for x in letters])
            if positions:
                # GREATEST: two orchestrators indexing at once never move a position back.
                await conn.execute(
                    f"""INSERT INTO {self._s}.dead_letter_positions (dlq_partition, next_offset)
                        SELECT * FROM unnest($1::int[], $2::bigint[])
                        ON CONFLICT (dlq_partition) DO UPDATE
                        SET next_offset = GREATEST(dead_letter_positions.next_offset, EXCLUDED.next_offset)""",
                    list(positions), list(positions.values()))

    async def newest(self, where: LetterFilter, limit: int) -> list[IndexedLetter]:
        rows = await self._pool.fetch(
            f"""SELECT {_COLUMNS} FROM {self._s}.dead_letters
                WHERE ($1::text IS NULL OR saga_id = $1) AND ($2::text IS NULL OR source_topic = $2)
                  AND ($3::text IS NULL OR strpos(lower(reason), lower($3)) > 0)
                  AND ($4::bigint IS NULL OR failed_at_ms >= $4)
                ORDER BY failed_at_ms DESC, dlq_partition DESC, dlq_offset DESC LIMIT $5""",
            where.saga_id, where.source, where.reason, where.since_ms, limit)
        return [_letter(row) for row in rows]

    async def at(self, positions: Collection[tuple[int, int]]) -> list[IndexedLetter]:
        if not positions:
            return []
        rows = await self._pool.fetch(
            f"""SELECT {_COLUMNS} FROM {self._s}.dead_letters
                WHERE (dlq_partition, dlq_offset) IN (SELECT * FROM unnest($1::int[], $2::bigint[]))""",
            [p for p, _ in positions], [o for _, o in positions])
        return [_letter(row) for row in rows]

    async def mark_replayed(self, positions: Collection[tuple[int, int]], at_ms: int) -> None:
        if positions:
            await self._pool.execute(
                f"""UPDATE {self._s}.dead_letters SET replayed_at_ms = $3
                    WHERE (dlq_partition, dlq_offset) IN (SELECT * FROM unnest($1::int[], $2::bigint[]))""",
                [p for p, _ in positions], [o for _, o in positions], at_ms)

    async def dismiss(self, positions: Collection[tuple[int, int]], operator: str, reason: str, at_ms: int) -> None:
        if positions:
            await self._pool.execute(
                f"""UPDATE {self._s}.dead_letters SET dismissed_at_ms = $3, dismissed_by = $4, dismiss_reason = $5
                    WHERE (dlq_partition, dlq_offset) IN (SELECT * FROM unnest($1::int[], $2::bigint[]))""",
                [p for p, _ in positions], [o for _, o in positions], at_ms, operator, reason)

    async def unhandled(self, after: tuple[int, int, int] | None, since_ms: int | None, before_ms: int | None,
                        limit: int) -> list[IndexedLetter]:
        low = after or (-(2**62), -1, -1)
        rows = await self._pool.fetch(
            f"""SELECT {_COLUMNS} FROM {self._s}.dead_letters
                WHERE replayed_at_ms IS NULL AND dismissed_at_ms IS NULL
                  AND (failed_at_ms, dlq_partition, dlq_offset) > ($1, $2, $3)
                  AND ($4::bigint IS NULL OR failed_at_ms >= $4) AND ($5::bigint IS NULL OR failed_at_ms < $5)
                ORDER BY failed_at_ms, dlq_partition, dlq_offset LIMIT $6""",
            *low, since_ms, before_ms, limit)
        return [_letter(row) for row in rows]

    async def count(self) -> int:
        return int(await self._pool.fetchval(f"SELECT count(*) FROM {self._s}.dead_letters"))


class MemoryDeadLetterIndex:
    """``DeadLetterIndex`` in memory."""

    def __init__(self) -> None:
        self.letters: dict[tuple[int, int], IndexedLetter] = {}
        self.read_to: dict[int, int] = {}

    async def positions(self) -> dict[int, int]:
        return dict(self.read_to)

    async def record(self, letters: Sequence[IndexedLetter], positions: Mapping[int, int]) -> None:
        for letter in letters:
            self.letters.setdefault((letter.partition, letter.offset), letter)
        for partition, offset in positions.items():
            self.read_to[partition] = max(self.read_to.get(partition, offset), offset)

    async def newest(self, where: LetterFilter, limit: int) -> list[IndexedLetter]:
        return sorted((x for x in self.letters.values() if passes(x, where)), key=_key, reverse=True)[:limit]

    async def at(self, positions: Collection[tuple[int, int]]) -> list[IndexedLetter]:
        return [self.letters[position] for position in positions if position in self.letters]

    async def mark_replayed(self, positions: Collection[tuple[int, int]], at_ms: int) -> None:
        for position in positions:
            if position in self.letters:
                self.letters[position] = replace(self.letters[position], replayed_at_ms=at_ms)

    async def dismiss(self, positions: Collection[tuple[int, int]], operator: str, reason: str, at_ms: int) -> None:
        for position in positions:
            if position in self.letters:
                self.letters[position] = replace(self.letters[position], dismissed_at_ms=at_ms, dismissed_by=operator,
                                                 dismiss_reason=reason)

    async def unhandled(self, after: tuple[int, int, int] | None, since_ms: int | None, before_ms: int | None,
                        limit: int) -> list[IndexedLetter]:
        found = sorted((x for x in self.letters.values()
                        if x.replayed_at_ms is None and x.dismissed_at_ms is None and (after is None or _key(x) > after)
                        and (since_ms is None or x.failed_at_ms >= since_ms)
                        and (before_ms is None or x.failed_at_ms < before_ms)), key=_key)
        return found[:limit]

    async def count(self) -> int:
        return len(self.letters)
