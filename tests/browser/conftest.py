"""The console in a real Chromium (Debian's ``chromium``, driven by Playwright through its ``executable_path``:
no browser is downloaded) against the real services on a real Kafka and Postgres."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, BrowserContext, Dialog, Page, async_playwright

from saga_orchestrator.cli.run_cmd import service_environment
from saga_orchestrator.console.identity import add_user
from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.outbound import summary_of
from saga_orchestrator.orchestrator.ports import StoredEvent, Writes
from saga_orchestrator.orchestrator.store.postgres import PostgresStore, migrate
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas import wire
from saga_orchestrator.testing.history import SagaRun
from tests.chaos.crash_tools import started_and_ready
from tests.conftest import free_port, module_stack
from tests.e2e.harness import Stack

OPERATOR, PASSWORD = "ops-anna", "a long enough password"
DEFINITIONS = "tests.browser.console_trip:CONSOLE_TRIP"
CHROMIUM = os.environ.get("SAGA_TEST_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOTS = os.environ.get("SAGA_SCREENSHOTS")  # a folder: `make screenshots` keeps each page's picture there
SETTLE_S = 90.0  # the longest a test waits for sagas to get where it looks


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
          ) -> Iterator[Stack]:
    """Every service, and (console_url) the console, on the test module's SAGA_DEFINITIONS, else DEFINITIONS."""
    log_dir: Path = tmp_path_factory.mktemp("logs")
    definitions = getattr(request.module, "SAGA_DEFINITIONS", DEFINITIONS)
    yield from module_stack(started_and_ready(settings.model_copy(update={"saga_definitions": definitions}),
                                              log_dir), log_dir)


def serve_console(settings: Settings, folder: Path) -> Iterator[str]:
    """``saga console`` for ``settings`` as its own process, levers on, one local login (OPERATOR); its URL
    once it answers, the process stopped after (the body of a module fixture: ``yield from``)."""
    users = folder / "users"
    add_user(users, OPERATOR, PASSWORD)
    port = free_port()
    env = {**service_environment(settings), "SAGA_CONSOLE_LEVERS": "true", "SAGA_CONSOLE_USERS": str(users)}
    with (folder / "console.log").open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "saga_orchestrator.cli", "console", "--port", str(port)],
                                   env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/openapi.json", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("the console did not start: "
                                         + (folder / "console.log").read_text()) from None
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="module")
def console_url(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``saga console`` beside the module's services."""
    yield from serve_console(stack.settings, tmp_path_factory.mktemp("console"))


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("no chromium on PATH: .ci/run installs Debian's chromium package")
        pytest.skip("no chromium on PATH (apt-get install chromium); the console's browser tests need it")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            await launched.close()


async def signed_in_context(browser: Browser, console_url: str) -> tuple[BrowserContext, Page]:
    """A fresh browser context signed in as OPERATOR on ``console_url`` (its tabs share the session), and the page
    that signed in, at the fleet; the caller closes the context."""
    context = await browser.new_context(base_url=console_url, viewport={"width": 1400, "height": 1000})
    opened = await context.new_page()
    await opened.goto("/login")
    await opened.fill("input[name=name]", OPERATOR)
    await opened.fill("input[name=password]", PASSWORD)
    await opened.click("form.login button")
    await opened.wait_for_url(f"{console_url}/")
    return context, opened


async def signed_in_page(browser: Browser, console_url: str) -> AsyncIterator[Page]:
    """A page of a fresh browser context signed in as OPERATOR on ``console_url`` (the body of a fixture:
    ``async for``... ``yield``); the context closed after."""
    context, opened = await signed_in_context(browser, console_url)
    try:
        yield opened
    finally:
        await context.close()


def accepting_dialogs(page: Page) -> list[str]:
    """Each confirmation ``page`` asks is accepted, and its text kept in the list answered."""
    asked: list[str] = []

    async def accept(dialog: Dialog) -> None:
        asked.append(dialog.message)
        await dialog.accept()

    page.on("dialog", accept)
    return asked


@pytest.fixture
async def page(browser: Browser, console_url: str) -> AsyncIterator[Page]:
    """A browser page signed in as OPERATOR."""
    async for opened in signed_in_page(browser, console_url):
        yield opened


async def screenshot(page: Page, name: str) -> None:
    """Keep a picture of the page as SAGA_SCREENSHOTS/NAME.png when that folder is given (the docs' pictures;
    Playwright makes the folder)."""
    if SCREENSHOTS:
        await page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)


def api(console_url: str, path: str) -> Any:
    """GET the console's API as OPERATOR (HTTP Basic with the local login)."""
    request = urllib.request.Request(f"{console_url}/api/v1{path}", headers={"Authorization": _basic()})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def api_post(console_url: str, path: str, body: dict[str, Any]) -> Any:
    """POST ``body`` as JSON to the console's API as OPERATOR; what it answered."""
    request = urllib.request.Request(f"{console_url}/api/v1{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": _basic(), "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def _basic() -> str:
    return "Basic " + base64.b64encode(f"{OPERATOR}:{PASSWORD}".encode()).decode()


async def record_failed_trip(settings: Settings, saga_id: str, ended_ms: int) -> None:
    """Record, as the orchestrator does, a trip that was charged and then ended FAILED at ``ended_ms`` on its
    itinerary: its events and its read-model row."""
    run = SagaRun(TRIP, saga_id=saga_id, now=ended_ms)
    run.start()
    for step in ("book_flight", "book_hotel", "charge_card"):
        run.ok(step)
    run.fail("send_itinerary", "AddressGone")
    pool = await create_pool(settings.dsn(), 1)
    try:
        await migrate(pool)
        async with PostgresStore(pool).begin() as uow:
            await uow.write(Writes(
                events=[StoredEvent(e.saga_id, e.seq, type(e).__name__, wire.encode_event(e),
                                    recorded_at_ms=e.occurred_at) for e in run.events],
                summaries=[summary_of(run.saga)]))
    finally:
        await pool.close()


def history(console_url: str, saga_id: str) -> list[dict[str, Any]]:
    """The saga's events through the console's API ([] while it has none)."""
    try:
        found: list[dict[str, Any]] = api(console_url, f"/sagas/{saga_id}/history")
    except OSError:
        return []
    return found


async def until(check: Any, what: str, timeout_s: float = SETTLE_S) -> Any:
    """What ``check()`` returns once it is true, polling 4 times a second; AssertionError after ``timeout_s``."""
    for _ in range(int(timeout_s / 0.25)):
        found = check()
        if found:
            return found
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")
