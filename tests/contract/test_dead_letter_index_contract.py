"""One contract for the dead-letter index (``orchestrator.ports.DeadLetterIndex``), run against the memory adapter and
the Postgres one of the orchestrator's schema: a letter is kept once per position, the positions read never move
back, the lists filter and order as the console and ``saga dlq`` expect, a replayed or dismissed letter is handled."""

from __future__ import annotations

import asyncpg
import pytest

from saga_orchestrator.orchestrator.ports import DeadLetterIndex, IndexedLetter, LetterFilter
from saga_orchestrator.orchestrator.store.dead_letters import MemoryDeadLetterIndex, PostgresDeadLetterIndex


@pytest.fixture(params=["memory", "postgres"])
def pool_or_none(request: pytest.FixtureRequest) -> asyncpg.Pool | None:
    return None if request.param == "memory" else request.getfixturevalue("pg_pool")


@pytest.fixture
async def index(pool_or_none: asyncpg.Pool | None) -> DeadLetterIndex:
    if pool_or_none is None:
        return MemoryDeadLetterIndex()
    await pool_or_none.execute("TRUNCATE saga.dead_letters, saga.dead_letter_positions")
    return PostgresDeadLetterIndex(pool_or_none)


def letter(partition: int, offset: int, failed_at: int, saga_id: str | None = "s-1", *,
           source: str | None = "saga.start", reason: str | None = "unknown saga_type 'cruise'",
           record: bytes | None = b"\xc3\x01letter") -> IndexedLetter:
    return IndexedLetter(partition, offset, failed_at + 5, failed_at, saga_id, source, reason, record)


def positions(found: list[IndexedLetter]) -> list[tuple[int, int]]:
    return [(x.partition, x.offset) for x in found]


async def test_a_letter_is_kept_once_per_position_and_the_positions_never_move_back(index: DeadLetterIndex) -> None:
    assert await index.positions() == {}
    await index.record([letter(0, 0, 100), letter(1, 0, 200)], {0: 1, 1: 1})
    await index.record([letter(0, 0, 999, "other"), letter(0, 1, 300)], {0: 2})  # a batch read again, and more
    await index.record([], {0: 1, 2: 7})  # a second indexer behind the first
    assert await index.count() == 3
    assert await index.positions() == {0: 2, 1: 1, 2: 7}
    kept = await index.at([(0, 0), (5, 5)])
    assert [(x.saga_id, x.failed_at_ms, x.written_at_ms, x.record) for x in kept] == [
        ("s-1", 100, 105, b"\xc3\x01letter")]


async def test_the_newest_letters_pass_the_filters_newest_first(index: DeadLetterIndex) -> None:
    await index.record([letter(0, 0, 100, "a"), letter(1, 0, 300, "b", source="trip.flight.results"),
                        letter(0, 1, 200, "a", reason="Reply refused: NO SUCH attempt"),
                        letter(1, 1, 300, None, source=None, reason=None, record=b"junk")], {0: 2, 1: 2})
    assert positions(await index.newest(LetterFilter(), 10)) == [(1, 1), (1, 0), (0, 1), (0, 0)]
    assert positions(await index.newest(LetterFilter(), 2)) == [(1, 1), (1, 0)]
    assert positions(await index.newest(LetterFilter(saga_id="a"), 10)) == [(0, 1), (0, 0)]
    assert positions(await index.newest(LetterFilter(source="trip.flight.results"), 10)) == [(1, 0)]
    assert positions(await index.newest(LetterFilter(reason="no such"), 10)) == [(0, 1)]
    assert positions(await index.newest(LetterFilter(since_ms=200), 10)) == [(1, 1), (1, 0), (0, 1)]
    assert positions(await index.newest(LetterFilter(saga_id="a", since_ms=150), 10)) == [(0, 1)]


async def test_the_letters_never_replayed_come_oldest_first_after_a_key(index: DeadLetterIndex) -> None:
    await index.record([letter(0, 0, 100), letter(0, 1, 200), letter(1, 0, 200), letter(1, 1, 400)], {0: 2, 1: 2})
    await index.mark_replayed([(0, 1), (9, 9)], 500)
    assert [x.replayed_at_ms for x in await index.at([(0, 1)])] == [500]
    assert positions(await index.unhandled(None, None, None, 10)) == [(0, 0), (1, 0), (1, 1)]
    assert positions(await index.unhandled((100, 0, 0), None, None, 1)) == [(1, 0)]
    assert positions(await index.unhandled(None, 150, 400, 10)) == [(1, 0)]


async def test_a_dismissed_letter_is_handled_keeps_who_and_why_and_can_still_be_replayed(
        index: DeadLetterIndex) -> None:
    await index.record([letter(0, 0, 100), letter(0, 1, 200), letter(1, 0, 300, None, record=b"junk")], {0: 2, 1: 1})
    await index.dismiss([(1, 0), (9, 9)], "anna", "garbage nobody can read", 500)
    assert positions(await index.unhandled(None, None, None, 10)) == [(0, 0), (0, 1)]
    [kept] = await index.at([(1, 0)])
    assert (kept.dismissed_at_ms, kept.dismissed_by, kept.dismiss_reason, kept.replayed_at_ms) == (
        500, "anna", "garbage nobody can read", None)
    await index.dismiss([(1, 0)], "ben", "still garbage", 600)  # the later dismissal is the one kept
    await index.mark_replayed([(1, 0)], 700)  # replayed on purpose after all: the dismissal stays beside it
    [kept] = await index.at([(1, 0)])
    assert (kept.dismissed_at_ms, kept.dismissed_by, kept.dismiss_reason, kept.replayed_at_ms) == (
        600, "ben", "still garbage", 700)
    await index.dismiss([(0, 0)], "anna", "a start made by mistake", 800)
    assert positions(await index.unhandled(None, None, None, 10)) == [(0, 1)]
    assert positions(await index.newest(LetterFilter(), 10)) == [(1, 0), (0, 1), (0, 0)]  # the lists keep them
