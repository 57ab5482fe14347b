"""The console's inbox on a real Postgres: a saga that failed more than a day ago is still listed, paging by
cursor returns each item once, the page and the navigation's count render."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from saga_orchestrator.console.app import console_app
from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.ports import SagaSummaryRow, Writes
from saga_orchestrator.orchestrator.store.postgres import PostgresStore, migrate

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def recorded(settings: Settings) -> AsyncIterator[tuple[str, list[str]]]:
    """Sagas of a type of their own (the database is shared): their type and their ids, stuck longest first."""
    saga_type = f"inbox-{uuid.uuid4().hex[:8]}"
    now = time.time_ns() // 1_000_000
    rows = [SagaSummaryRow(f"{saga_type}-failed", saga_type, None, "FAILED", now - 30 * HOUR_MS, now - 26 * HOUR_MS,
                           9, failed_step="send_itinerary", reason="AddressGone"),
            SagaSummaryRow(f"{saga_type}-undone", saga_type, None, "COMPENSATION_FAILED", now - 3 * HOUR_MS,
                           now - 2 * HOUR_MS, 12, failed_step="book_flight", reason="Refused"),
            SagaSummaryRow(f"{saga_type}-wedged", saga_type, None, "RUNNING", now - 2 * HOUR_MS, now - HOUR_MS, 7,
                           current_step="book_hotel", step_failures=4, last_error="HotelBusy"),
            *[SagaSummaryRow(f"{saga_type}-q{n}", saga_type, None, "QUARANTINED", now - HOUR_MS, now - 60_000, 3,
                             reason="undecodable") for n in range(3)],  # one millisecond: the id orders them
            SagaSummaryRow(f"{saga_type}-done", saga_type, None, "COMPLETED", now - 40 * HOUR_MS, now - 39 * HOUR_MS,
                           9)]
    pool = await create_pool(settings.dsn(), 2)
    await migrate(pool)
    async with PostgresStore(pool).begin() as uow:
        await uow.write(Writes(summaries=rows))
    yield saga_type, [row.saga_id for row in rows[:-1]]
    await pool.execute("DELETE FROM saga.saga_summary WHERE saga_type = $1", saga_type)
    await pool.close()


@pytest_asyncio.fixture(loop_scope="module")
async def client(settings: Settings, recorded: tuple[str, list[str]]) -> AsyncIterator[httpx.AsyncClient]:
    app = console_app(settings)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://console") as reader:
        yield reader


async def _json(client: httpx.AsyncClient, path: str, params: dict[str, Any], status: int = 200) -> Any:
    answer = await client.get(path, params=params)
    assert answer.status_code == status, answer.text
    return answer.json()


@pytest.mark.asyncio(loop_scope="module")
async def test_the_inbox_lists_old_failures_and_pages_each_item_once(client: httpx.AsyncClient,
                                                                    recorded: tuple[str, list[str]]) -> None:
    saga_type, expected = recorded
    whole = await _json(client, "/api/v1/inbox", {"type": saga_type})
    assert [item["saga_id"] for item in whole["items"]] == expected and whole["next_cursor"] is None
    failed = whole["items"][0]
    assert failed["kind"] == "failed" and time.time() * 1000 - failed["stuck_since_ms"] > 26 * HOUR_MS - 60_000
    assert [lever["label"] for lever in failed["levers"]] == ["open", "Redrive", "ForceCompensate", "Terminate"]
    assert [item["kind"] for item in whole["items"][1:3]] == ["compensation_failed", "wedged"]

    seen: list[str] = []
    cursor = ""
    for _ in range(10):
        page = await _json(client, "/api/v1/inbox", {"type": saga_type, "limit": 2, "cursor": cursor})
        assert len(page["items"]) <= 2
        seen += [item["saga_id"] for item in page["items"]]
        if page["next_cursor"] is None:
            break
        cursor = page["next_cursor"]
    assert seen == expected  # each once, in order

    quarantined = await _json(client, "/api/v1/inbox", {"type": saga_type, "kind": "QUARANTINED"})
    assert [item["saga_id"] for item in quarantined["items"]] == expected[3:]
    await _json(client, "/api/v1/inbox", {"kind": "sleepy"}, status=400)
    await _json(client, "/api/v1/inbox", {"cursor": "nonsense"}, status=400)
    assert (await _json(client, "/api/v1/inbox/count", {}))["count"] >= 5


@pytest.mark.asyncio(loop_scope="module")
async def test_the_inbox_page_links_each_item_and_the_next_page(client: httpx.AsyncClient,
                                                               recorded: tuple[str, list[str]]) -> None:
    saga_type, expected = recorded
    page = await client.get("/inbox", params={"type": saga_type, "limit": 4})
    assert page.status_code == 200, page.text
    assert f'href="/sagas/{expected[0]}"' in page.text and expected[4] not in page.text
    assert 'rel="next"' in page.text
    after = page.text.split('rel="next" href="')[1].split('"')[0].replace("&amp;", "&")
    rest = await client.get(after)
    assert rest.status_code == 200 and expected[4] in rest.text and expected[0] not in rest.text
    badge = await client.get("/inbox/count")
    assert badge.status_code == 200 and "data-count" in badge.text
    assert 'href="/inbox"' in (await client.get("/")).text
