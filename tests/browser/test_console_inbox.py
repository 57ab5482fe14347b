"""The console's inbox in Chromium: a saga that ended FAILED more than a day ago is listed, and its line leads to
its page, at its levers."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from playwright.async_api import Browser, Page

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.outbound import summary_of
from saga_orchestrator.orchestrator.ports import StoredEvent, Writes
from saga_orchestrator.orchestrator.store.postgres import PostgresStore, migrate
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas import wire
from saga_orchestrator.testing.history import SagaRun
from tests.browser.conftest import DEFINITIONS, screenshot, serve_console, signed_in_page

pytestmark = pytest.mark.e2e

DAY_MS = 86_400_000


@pytest.fixture(scope="module")
async def failed_long_ago(settings: Settings) -> AsyncIterator[tuple[str, int]]:
    """A trip that ended FAILED 26 hours ago, recorded as the orchestrator records it: its id and when it ended."""
    ended_ms = time.time_ns() // 1_000_000 - DAY_MS - 2 * 3_600_000
    run = SagaRun(TRIP, saga_id=f"inbox-{uuid.uuid4().hex[:10]}", now=ended_ms)
    run.start()
    for step in ("book_flight", "book_hotel", "charge_card"):
        run.ok(step)
    run.fail("send_itinerary", "AddressGone")
    pool = await create_pool(settings.dsn(), 2)
    await migrate(pool)
    async with PostgresStore(pool).begin() as uow:
        await uow.write(Writes(
            events=[StoredEvent(e.saga_id, e.seq, type(e).__name__, wire.encode_event(e), recorded_at_ms=e.occurred_at)
                    for e in run.events], summaries=[summary_of(run.saga)]))
    try:
        yield run.saga.saga_id, ended_ms
    finally:  # the database is shared: no FAILED saga of this test stays in others' inboxes
        await pool.execute("DELETE FROM saga.events WHERE saga_id = $1", run.saga.saga_id)
        await pool.execute("DELETE FROM saga.saga_summary WHERE saga_id = $1", run.saga.saga_id)
        await pool.close()


@pytest.fixture(scope="module")
def inbox_console(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The console alone (the inbox reads the database; no service needs to run)."""
    yield from serve_console(settings.model_copy(update={"saga_definitions": DEFINITIONS}),
                             tmp_path_factory.mktemp("console"))


@pytest.fixture
async def page(browser: Browser, inbox_console: str) -> AsyncIterator[Page]:
    async for opened in signed_in_page(browser, inbox_console):
        yield opened


async def test_the_inbox_lists_a_saga_failed_a_day_ago_and_leads_to_its_levers(
        page: Page, failed_long_ago: tuple[str, int]) -> None:
    saga_id, ended_ms = failed_long_ago
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ended_ms / 1000 - 1))
    await page.goto("/")
    await page.click("nav a.inbox")
    await page.wait_for_url("**/inbox")
    await page.goto(f"/inbox?kind=failed&stuck_after={since}&limit=500")
    line = page.locator(f'tr[data-item="{saga_id}"]')
    await line.wait_for()
    assert await line.get_attribute("data-kind") == "failed"
    assert "send_itinerary" in await line.inner_text()
    await screenshot(page, "inbox")
    await line.locator("a.lever", has_text="Redrive").click()
    await page.wait_for_url(f"**/sagas/{saga_id}#levers")
    assert saga_id in await page.locator("h1").inner_text()
