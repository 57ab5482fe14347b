"""Fences for late forwards (real Postgres): once a participant handled a step's compensation, a forward
command of that step that arrives later (a replay of an old command, a zombie relay, a partition move) is
answered FAILED Compensated from the tombstone and does not run, in whatever order and batch it comes."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from saga_orchestrator.participants.kit.handling import Disposition, handle_commands
from saga_orchestrator.participants.kit.ledger import COMPENSATED, FENCED
from tests.integration.test_participants import (
    FLIGHT,
    TOPICS,
    command,
    delivered,
    new_saga_id,
    pool,
    processed,
    replies,
)

pytestmark = pytest.mark.integration
__all__ = ["pool"]  # the module fixture, shared


def _book(saga_id: str, attempt: int = 1, **trip: Any) -> tuple[bytes, dict[str, bytes]]:
    return command(saga_id, "flight", "book_flight", attempt=attempt, **trip)


def _cancel(saga_id: str) -> tuple[bytes, dict[str, bytes]]:
    return command(saga_id, "flight", "cancel_flight", compensate=True)


async def _deliver(pool: asyncpg.Pool, *messages: tuple[bytes, dict[str, bytes]]) -> list[Disposition]:
    return await handle_commands(pool, FLIGHT, TOPICS, [delivered(FLIGHT, *message) for message in messages])


async def _booking(pool: asyncpg.Pool, saga_id: str) -> str | None:
    status: str | None = await pool.fetchval("SELECT status FROM flight.bookings WHERE saga_id = $1", saga_id)
    return status


async def _last_forward_reply(pool: asyncpg.Pool, saga_id: str) -> tuple[str, str | None]:
    result = [r["result"] for r in await replies(pool, "flight", saga_id) if r["result"]["kind"] == "FORWARD"][-1]
    return result["status"], result["error_type"]


@pytest.mark.parametrize("together", [False, True], ids=["later", "in the same batch"])
async def test_a_forward_after_its_compensation_is_fenced(pool: asyncpg.Pool, together: bool) -> None:
    saga_id = new_saga_id()
    if together:
        assert await _deliver(pool, _cancel(saga_id), _book(saga_id)) == [Disposition.RECORDED, Disposition.FENCED]
    else:
        assert await _deliver(pool, _cancel(saga_id)) == [Disposition.RECORDED]
        assert await _deliver(pool, _book(saga_id)) == [Disposition.FENCED]
    assert await _booking(pool, saga_id) is None  # the handler never ran
    assert await _last_forward_reply(pool, saga_id) == ("FAILED", COMPENSATED)
    assert await _deliver(pool, _book(saga_id, attempt=5)) == [Disposition.FENCED]  # any later attempt too
    forward = [r for r in await processed(pool, "flight", saga_id) if r["kind"] == "FORWARD"]
    assert [r["status"] for r in forward] == [FENCED]


async def test_a_failed_forward_is_fenced_and_not_taken_up_again(pool: asyncpg.Pool) -> None:
    saga_id = new_saga_id()
    # Refused at first (same airport), then compensated by a saga that gave up on the step's attempts.
    assert await _deliver(pool, _book(saga_id, destination="LHR")) == [Disposition.RECORDED]
    assert await _last_forward_reply(pool, saga_id) == ("FAILED", "InvalidRoute")
    assert await _deliver(pool, _cancel(saga_id)) == [Disposition.RECORDED]
    # A later attempt would have taken a recorded failure up again and booked; now it is fenced.
    assert await _deliver(pool, _book(saga_id, attempt=2)) == [Disposition.FENCED]
    assert await _booking(pool, saga_id) is None


async def test_a_succeeded_forward_keeps_its_success_and_its_cancellation(pool: asyncpg.Pool) -> None:
    saga_id = new_saga_id()
    assert await _deliver(pool, _book(saga_id)) == [Disposition.RECORDED]
    assert await _deliver(pool, _cancel(saga_id)) == [Disposition.RECORDED]
    assert await _deliver(pool, _book(saga_id, attempt=2)) == [Disposition.DUPLICATE]
    assert await _last_forward_reply(pool, saga_id) == ("SUCCEEDED", None)
    assert await _booking(pool, saga_id) == "cancelled"  # booked once, cancelled once, not booked again
