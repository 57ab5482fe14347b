"""A saga page's timeline on a real Postgres: the page shows the newest rows, the retry loop it ends in apart (the
stream draws it again), and its "earlier" fragments, read back a few events at a time, put together the whole
timeline, a retry loop of many events one row whichever page it falls on."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from html import unescape

import httpx
import pytest
import pytest_asyncio

from saga_orchestrator.console import pages
from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.bootstrap import prepare
from saga_orchestrator.orchestrator.domain.builder import TimerKind
from saga_orchestrator.orchestrator.store.postgres import migrate
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas.registry import default_registry
from saga_orchestrator.testing.history import SagaRun
from tests.integration.test_console_api import _client, _record

pytestmark = pytest.mark.integration

ROWS, READ = 3, 4  # a page's rows and the events a fragment reads first: the loop spans many reads
FAILURES = 12


def _run(saga_id: str, *, settled: bool) -> SagaRun:
    """A trip whose itinerary fails ``FAILURES`` times, then goes through when ``settled``."""
    run = SagaRun(TRIP, saga_id=saga_id)
    run.start()
    for step in ("book_flight", "book_hotel", "charge_card"):
        run.ok(step)
    for _ in range(FAILURES):
        run.fail("send_itinerary", "MailerDown", retryable=True)
        run.fire(TimerKind.STEP_RETRY, "send_itinerary")
    if settled:
        run.ok("send_itinerary")
    return run


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    await prepare(settings)
    pool = await create_pool(settings.dsn(), 2)
    await migrate(pool)
    await _record(pool, {saga_id: _run(saga_id, settled=saga_id == "timeline-done")
                         for saga_id in ("timeline-done", "timeline-looping")})
    await pool.close()
    async for console in _client(settings):
        yield console


def _ids(html: str) -> list[str]:
    return re.findall(r'<tr id="([^"]+)"', html)


def _earlier(html: str) -> str | None:
    found = re.search(r'hx-get="([^"]+/timeline\?before=\d+)"', html)
    return unescape(found.group(1)) if found else None


def _expected(saga_id: str, settled: bool) -> list[str]:
    events = _run(saga_id, settled=settled).events
    return [row["id"] for row in pages.timeline([(e.occurred_at, e) for e in events], default_registry())]


@pytest.mark.asyncio(loop_scope="module")
async def test_the_earlier_fragments_put_together_the_whole_timeline(
        client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pages, "TIMELINE_ROWS", ROWS)
    monkeypatch.setattr(pages, "TIMELINE_READ", READ)
    page = await client.get("/sagas/timeline-done")
    assert page.status_code == 200, page.text
    body = page.text.split('<tbody id="timeline-rows"', 1)[1]
    rows, tail = body.split('<tbody id="timeline-tail"', 1)
    assert _ids(tail) == []  # it ended: no loop goes on
    shown = _ids(rows)
    assert len(shown) == ROWS
    link = _earlier(rows)
    while link is not None:
        fragment = await client.get(link)
        assert fragment.status_code == 200, fragment.text
        assert 0 < len(_ids(fragment.text)) <= ROWS
        shown = _ids(fragment.text) + shown
        link = _earlier(fragment.text)
    expected = _expected("timeline-done", settled=True)
    assert shown == expected and sum(1 for row in shown if row.startswith("loop-send_itinerary-")) == 1


@pytest.mark.asyncio(loop_scope="module")
async def test_a_page_shows_the_loop_it_ends_in_apart_for_its_stream_to_draw_again(
        client: httpx.AsyncClient) -> None:
    page = await client.get("/sagas/timeline-looping")
    rows, tail = page.text.split('<tbody id="timeline-rows"', 1)[1].split('<tbody id="timeline-tail"', 1)
    [loop] = _ids(tail)
    assert [*_ids(rows), loop] == _expected("timeline-looping", settled=False)
    assert loop.startswith("loop-send_itinerary-") and f"attempts 1\u2013{FAILURES}, MailerDown" in tail
    assert _earlier(rows) is None  # fewer rows than a page holds
