"""The console on a real Postgres: a saga whose id holds ``/``, ``?``, ``#``, spaces or any script opens in the API
and in its page, and the list's links lead to it; the saga lists page by cursor through ten thousand sagas, each
once and in order, the operator audit too, newest first; a cursor no page gave is refused plainly."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from html import unescape
from urllib.parse import quote

import asyncpg
import httpx
import pytest
import pytest_asyncio

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.bootstrap import prepare
from saga_orchestrator.orchestrator.store.postgres import migrate
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.testing.history import SagaRun
from tests.integration.test_console_api import _client, _record

pytestmark = pytest.mark.integration

ODD_IDS = ("a/b", "a?b", "a#b", "rés/ümé 1")
PAGED = 10_000
SAME_MS = 7  # sagas started in one millisecond: the saga id orders them


async def _fill(pool: asyncpg.Pool) -> None:
    """``PAGED`` ended sagas in the read model, in one statement; ids out of their start order, so the order is the
    store's and not the insertion's."""
    await pool.execute(
        "INSERT INTO saga.saga_summary (saga_id, saga_type, status, started_at, updated_at, last_seq)"
        " SELECT 'paged-' || md5(n::text), 'trip', 'COMPLETED',"
        "        timestamptz '2026-01-01 00:00:00+00' + (n / $2) * interval '1 millisecond', now(), 9"
        " FROM generate_series(1, $1) AS n", PAGED, SAME_MS, timeout=None)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    await prepare(settings)
    pool = await create_pool(settings.dsn(), 2)
    await migrate(pool)
    runs = {}
    for saga_id in ODD_IDS:
        run = SagaRun(TRIP, saga_id=saga_id)
        run.start()
        run.ok("book_flight")
        runs[saga_id] = run
    await _record(pool, runs)
    await _fill(pool)
    await pool.close()
    async for console in _client(settings):
        yield console


@pytest.mark.asyncio(loop_scope="module")
async def test_a_saga_of_any_id_opens_in_the_api_and_its_page_and_the_list_links_to_it(
        client: httpx.AsyncClient) -> None:
    for saga_id in ODD_IDS:
        segment = quote(saga_id, safe="")
        saga = await client.get(f"/api/v1/sagas/{segment}")
        assert saga.status_code == 200 and saga.json()["saga_id"] == saga_id, (saga_id, saga.text)
        history = await client.get(f"/api/v1/sagas/{segment}/history")
        assert history.status_code == 200 and history.json()[0]["type"] == "SagaStarted", (saga_id, history.text)
        assert "StepSucceeded" in [event["type"] for event in history.json()]
        page = await client.get(f"/sagas/{segment}")
        assert page.status_code == 200 and f"<h1>{saga_id}</h1>" in unescape(page.text), saga_id
    assert (await client.get("/api/v1/sagas/a")).status_code == 404  # the first segment of a/b is no saga
    listed = await client.get("/sagas?status=RUNNING")
    links = re.findall(r'<a href="(/sagas/[^"?]+)">([^<]+)</a>', listed.text)
    assert sorted(unescape(name) for _, name in links) == sorted(ODD_IDS)
    for href, name in links:
        page = await client.get(unescape(href))
        assert page.status_code == 200 and f"<h1>{unescape(name)}</h1>" in unescape(page.text), href


async def _pages(client: httpx.AsyncClient, first: str) -> AsyncIterator[httpx.Response]:
    url: str | None = first
    while url is not None:
        answer = await client.get(url)
        assert answer.status_code == 200, answer.text
        yield answer
        following = re.fullmatch(r'<([^>]+)>; rel="next"', answer.headers.get("Link", ""))
        assert (following is None) == ("Link" not in answer.headers), answer.headers["Link"]
        url = None if following is None else following.group(1)


@pytest.mark.asyncio(loop_scope="module")
async def test_ten_thousand_sagas_page_by_cursor_each_once_and_in_order(client: httpx.AsyncClient,
                                                                        settings: Settings) -> None:
    pool = await create_pool(settings.dsn(), 1)
    try:
        expected = [r["saga_id"] for r in await pool.fetch(
            "SELECT saga_id FROM saga.saga_summary WHERE status = 'COMPLETED' ORDER BY started_at, saga_id")]
    finally:
        await pool.close()
    assert len(expected) == PAGED
    seen: list[str] = []
    sizes: list[int] = []
    async for answer in _pages(client, "/api/v1/sagas?status=COMPLETED&limit=500"):
        rows = answer.json()
        sizes.append(len(rows))
        seen += [row["saga_id"] for row in rows]
        assert (answer.headers.get("X-Next-Cursor") is None) == (len(seen) == PAGED)
    assert seen == expected and sizes == [500] * (PAGED // 500)
    # the console's list: 500 a page, and a next link to the following 500
    first = await client.get("/sagas?status=COMPLETED")
    shown = re.findall(r'<tr data-saga="([^"]+)">', first.text)
    following = re.search(r'<a rel="next" href="([^"]+)">', first.text)
    assert shown == expected[:500] and following is not None
    second = await client.get(unescape(following.group(1)))
    assert re.findall(r'<tr data-saga="([^"]+)">', second.text) == expected[500:1000]


@pytest.mark.asyncio(loop_scope="module")
async def test_a_cursor_no_page_gave_is_refused_with_a_400_that_says_so(client: httpx.AsyncClient) -> None:
    for cursor in ("!!!", "bm90IGpzb24", "WzEsMl0", "A" * 3000, "WzFlNDAwLCJhIl0"):
        for path in ("/api/v1/sagas", "/api/v1/quarantined"):
            answer = await client.get(path, params={"cursor": cursor})
            assert answer.status_code == 400 and answer.json()["detail"].startswith("malformed cursor"), answer.text
        assert (await client.get("/sagas", params={"cursor": cursor})).status_code == 400
        assert (await client.get("/quarantine", params={"cursor": cursor})).status_code == 400
    assert (await client.get("/api/v1/quarantined")).json() == []
    for cursor in ("!!!", "WzEsMl0"):
        answer = await client.get("/api/v1/audit", params={"cursor": cursor})
        assert answer.status_code == 400 and answer.json()["detail"].startswith("malformed cursor"), answer.text
        assert (await client.get("/audit", params={"cursor": cursor})).status_code == 400


@pytest.mark.asyncio(loop_scope="module")
async def test_the_audit_pages_by_cursor_newest_first(client: httpx.AsyncClient, settings: Settings) -> None:
    pool = await create_pool(settings.dsn(), 1)
    try:
        await pool.execute("INSERT INTO saga.operator_audit (operator, action, target, outcome)"
                           " SELECT 'ana', 'Pause', 'saga s-' || n, 'queued' FROM generate_series(1, 450) AS n")
    finally:
        await pool.close()
    targets = [entry["target"] async for answer in _pages(client, "/api/v1/audit?limit=100")
               for entry in answer.json()]
    assert targets == [f"saga s-{n}" for n in range(450, 0, -1)]
    first = await client.get("/audit")
    following = re.search(r'<a rel="next" href="([^"]+)">', first.text)
    assert re.findall(r"<td>saga s-(\d+)</td>", first.text) == [str(n) for n in range(450, 250, -1)]
    assert following is not None
    second = await client.get(unescape(following.group(1)))
    assert re.findall(r"<td>saga s-(\d+)</td>", second.text) == [str(n) for n in range(250, 50, -1)]
