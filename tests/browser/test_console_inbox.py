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
from tests.browser.conftest import DEFINITIONS, record_failed_trip, screenshot, serve_console, signed_in_page

pytestmark = pytest.mark.e2e

DAY_MS = 86_400_000


@pytest.fixture(scope="module")
async def failed_long_ago(settings: Settings) -> AsyncIterator[tuple[str, int]]:
    """A trip that ended FAILED 26 hours ago, recorded as the orchestrator records it: its id and when it ended."""
    ended_ms = time.time_ns() // 1_000_000 - DAY_MS - 2 * 3_600_000
    saga_id = f"inbox-{uuid.uuid4().hex[:10]}"
    await record_failed_trip(settings, saga_id, ended_ms)
    pool = await create_pool(settings.dsn(), 1)
    try:
        yield saga_id, ended_ms
    finally:  # the database is shared: no FAILED saga of this test stays in others' inboxes
        await pool.execute("DELETE FROM saga.events WHERE saga_id = $1", saga_id)
        await pool.execute("DELETE FROM saga.saga_summary WHERE saga_id = $1", saga_id)
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
