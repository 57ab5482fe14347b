"""An operator's morning in a real Chromium, worked from the inbox alone, over the real services: completed and
compensated trips beside a trip that ended FAILED 26 hours ago, an undoing that failed for good, a checkout failed
after its pivot, a trip quarantined by a rollback (its first release refused: the rollback is not fixed yet), dead
letters, a courier waiting for a person's answer, and the notification worker down with trips waiting on it (the
inbox names the participant no worker serves; a timed-out attempt is not retried blindly, so they are not wedged).
Each item is found in the inbox, opened from its line and handled with its lever; the page shows each lever's
decision and the levers that apply after it without a reload; at the end the inbox is empty.

Before that, ten saga tabs and the fleet are open at once in one browser: each loads within 2 s and stays live.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, expect

from saga_orchestrator.client import SagaClient
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas.topics import Topics
from tests.browser.conftest import (
    OPERATOR,
    SETTLE_S,
    accepting_dialogs,
    api,
    api_post,
    history,
    record_failed_trip,
    screenshot,
    signed_in_context,
    until,
)
from tests.browser.morning import WORKERS
from tests.chaos.crash_tools import restart, started_and_ready
from tests.conftest import module_stack
from tests.e2e.apps import order
from tests.e2e.harness import Stack, publish

pytestmark = pytest.mark.e2e

APP = "tests.browser.morning:MORNING"
ROLLED_BACK = {"SAGA_APP": "tests.browser.morning:ROLLED_BACK", "SAGA_ALLOW_STRANDING": "true"}
HOUR_MS = 3_600_000
LOADED_WITHIN_S = 2.0


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("logs")
    morning = settings.model_copy(update={"saga_app": APP, "saga_definitions": None, "saga_participants": WORKERS})
    yield from module_stack(started_and_ready(morning, log_dir), log_dir)


def _status(console_url: str, saga_id: str) -> str | None:
    try:
        found: str = api(console_url, f"/sagas/{saga_id}")["status"]
    except OSError:
        return None
    return found


async def _pull(page: Page, action: str, reason: str, said: str) -> None:
    """Pull ``action`` on the open saga page with ``reason``; the page must say ``said`` (its decision)."""
    lever = page.locator(f"form.lever[data-action='{action}']")
    await lever.locator("input[name=reason]").fill(reason)
    await lever.locator("button").click()
    await expect(page.locator("#flash")).to_contain_text(said, timeout=SETTLE_S * 1000)


async def _offered(page: Page) -> list[str]:
    """The levers the open saga page offers now."""
    return sorted([await form.get_attribute("data-action") or ""
                   for form in await page.locator("form.lever").all()])


async def _open_from_inbox(page: Page, item_id: str, link: str) -> None:
    """From the inbox, the line of ``item_id`` and its link labelled ``link``, followed."""
    await page.goto("/inbox?limit=500")
    line = page.locator(f"table.inbox tr[data-item='{item_id}']")
    await expect(line).to_have_count(1)
    await line.locator("a.lever", has_text=link).first.click()


def _inbox(console_url: str) -> list[dict[str, object]]:
    found: list[dict[str, object]] = api(console_url, "/inbox?limit=500")["items"]
    return found


async def test_ten_saga_tabs_and_the_fleet_load_within_two_seconds_and_stay_live(
        browser: Browser, stack: Stack, console_url: str) -> None:
    ids = [f"tab-{uuid.uuid4().hex[:6]}-{n}" for n in range(10)]
    async with SagaClient.from_settings(stack.settings) as client:
        for saga_id in ids:  # each waits ten minutes for a person to book its courier
            await client.start("courier_checkout", saga_id, order(saga_id, address="ask"))
    await until(lambda: all(any(e["type"] == "StepCommandSent" and e["fields"].get("step") == "book_courier"
                                for e in history(console_url, saga_id)) for saga_id in ids), "the couriers asked")
    context, signed_in = await signed_in_context(browser, console_url)
    await signed_in.close()
    try:
        tabs: list[Page] = []
        for saga_id in ids:
            tab = await context.new_page()
            began = time.monotonic()
            await tab.goto(f"/sagas/{saga_id}")
            await expect(tab.locator("form.lever[data-action=Pause]")).to_have_count(1)
            assert time.monotonic() - began < LOADED_WITHIN_S, f"tab {len(tabs) + 1} took {time.monotonic() - began}"
            await tab.evaluate("window.loadedOnce = true")
            tabs.append(tab)
        fleet = await context.new_page()
        began = time.monotonic()
        await fleet.goto("/")
        await expect(fleet.locator("[data-status-count=RUNNING]")).to_have_text("10")
        assert time.monotonic() - began < LOADED_WITHIN_S, f"the fleet took {time.monotonic() - began:.2f} s"
        await screenshot(fleet, "fleet-beside-ten-tabs")
        # Live: each saga paused elsewhere (the API), each tab shows it and offers Unpause, without a reload.
        for saga_id in ids:
            api_post(console_url, f"/sagas/{saga_id}/actions", {"action": "Pause", "reason": "tabs"})
        for tab in tabs:
            await expect(tab.locator("#saga-status")).to_contain_text("PAUSED", timeout=SETTLE_S * 1000)
            await expect(tab.locator("form.lever[data-action=Unpause]")).to_have_count(1)
            assert await tab.evaluate("window.loadedOnce") is True
    finally:
        await context.close()
    for saga_id in ids:  # ended, so that the morning's inbox is its own
        api_post(console_url, f"/sagas/{saga_id}/actions", {"action": "Terminate", "reason": "tabs done"})
    await until(lambda: all(_status(console_url, saga_id) == "TERMINATED" for saga_id in ids), "the tabs' sagas ended")


@pytest.fixture(scope="module")
async def morning(stack: Stack, console_url: str) -> AsyncIterator[dict[str, str]]:
    """The morning's sagas and letters, by role; settled: everything that ends has ended, and the inbox holds
    what needs a human."""
    ids = {role: f"{role}-{uuid.uuid4().hex[:6]}" for role in (
        "yesterday", "quarantined", "uncancellable", "unmapped", "ask", "declined", "garbage",
        *(f"happy{n}" for n in range(3)), *(f"wedged{n}" for n in range(2)))}
    await record_failed_trip(stack.settings, ids["yesterday"], time.time_ns() // 1_000_000 - 26 * HOUR_MS)
    async with SagaClient.from_settings(stack.settings) as client:
        for n in range(3):
            await client.start("trip", ids[f"happy{n}"], SCENARIOS["happy"].trip(ids[f"happy{n}"]))
        # A Slowtown trip (its hotel answers late) on version 2, which a rollback takes away while it books.
        await until(lambda: all(_status(console_url, ids[f"happy{n}"]) == "COMPLETED" for n in range(3)),
                    "the happy trips")
        await client.start("trip", ids["quarantined"], SCENARIOS["cancelled"].trip(ids["quarantined"]))
        await until(lambda: any(e["type"] == "StepCommandSent" and e["fields"].get("step") == "book_hotel"
                                for e in history(console_url, ids["quarantined"])), "the hotel's command")
    await restart(stack, "orchestrator", ROLLED_BACK)
    await until(lambda: _status(console_url, ids["quarantined"]) == "QUARANTINED", "the quarantine")
    # A record on the start topic that is no StartSaga: dead-lettered, nothing to replay.
    await publish(stack.settings, Topics(stack.settings.saga_topic_prefix).start, ids["garbage"].encode(),
                  b"not a start")
    stack.kill("notification")
    async with SagaClient.from_settings(stack.settings) as client:
        for n in range(2):
            await client.start("trip", ids[f"wedged{n}"], SCENARIOS["happy"].trip(ids[f"wedged{n}"]))
        await client.start("trip", ids["declined"], SCENARIOS["card_declined"].trip(ids["declined"]))
        await client.start("trip", ids["uncancellable"], SCENARIOS["uncancellable"].trip(ids["uncancellable"]))
        await client.start("courier_checkout", ids["unmapped"], order(ids["unmapped"], address="unmapped"))
        await client.start("courier_checkout", ids["ask"], order(ids["ask"], address="ask"))

    def settled() -> bool:
        kinds = {(item["kind"], item.get("saga_id") or item["item_id"]) for item in _inbox(console_url)}
        return ({("failed", ids["yesterday"]), ("failed", ids["unmapped"]), ("quarantined", ids["quarantined"]),
                 ("compensation_failed", ids["uncancellable"]), ("deferred", ids["ask"]),
                 ("unattended", "unattended:notification")} <= kinds
                and any(kind == "dead_letter" for kind, _ in kinds)
                and _status(console_url, ids["declined"]) == "COMPENSATED")

    try:
        await until(settled, "the morning's inbox", timeout_s=SETTLE_S * 2)
    except AssertionError:
        statuses = {saga_id: _status(console_url, saga_id) for saga_id in ids.values()}
        raise AssertionError(f"the morning did not settle: {statuses}; inbox {_inbox(console_url)}") from None
    yield ids


async def test_the_morning_is_worked_from_the_inbox_alone(
        page: Page, stack: Stack, console_url: str, morning: dict[str, str]) -> None:
    ids = morning
    asked = accepting_dialogs(page)
    await page.goto("/")
    await page.click("nav a.inbox")
    await page.wait_for_url("**/inbox")
    await expect(page.locator(f"table.inbox tr[data-item='{ids['yesterday']}']")).to_have_attribute(
        "data-kind", "failed")  # ended 26 hours ago, still here
    await expect(page.locator(f"table.inbox tr[data-item='{ids['yesterday']}']")).to_contain_text("send_itinerary")
    listed = len(_inbox(console_url))
    await expect(page.locator("table.inbox tbody tr[data-item]")).to_have_count(listed)
    await expect(page.locator("nav a.inbox .count")).to_have_text(str(listed))  # the badge counts every kind
    await screenshot(page, "morning-inbox")

    # The trip that failed yesterday after its card was charged: ended as it stands.
    await _open_from_inbox(page, ids["yesterday"], "Terminate")
    await page.wait_for_url(f"**/sagas/{ids['yesterday']}#levers")
    await page.evaluate("window.loadedOnce = true")
    assert "Terminate" in await _offered(page) and "Redrive" in await _offered(page)
    await _pull(page, "Terminate", "itinerary sent by hand", "Terminate applied")
    await expect(page.locator("#status-badge")).to_have_text("TERMINATED", timeout=SETTLE_S * 1000)
    await expect(page.locator("form.lever")).to_have_count(0)  # an ended saga offers nothing
    assert "nothing is undone" in asked[-1]

    # The undoing that the airline refused for good: the flight is cancelled by phone, the saga terminated.
    await _open_from_inbox(page, ids["uncancellable"], "Terminate")
    await _pull(page, "Terminate", "flight cancelled by phone", "Terminate applied")
    await expect(page.locator("#status-badge")).to_have_text("TERMINATED", timeout=SETTLE_S * 1000)

    # The checkout whose courier failed for good after its pivot: the map is fixed, it is re-driven and completes.
    await _open_from_inbox(page, ids["unmapped"], "Redrive")
    await _pull(page, "Redrive", "courier map fixed", "Redrive applied")
    await expect(page.locator("#status-badge")).to_have_text("COMPLETED", timeout=SETTLE_S * 1000)

    # The quarantined trip: released too soon, refused (the rollback still stands), and the page says so.
    await _open_from_inbox(page, ids["quarantined"], "Release")
    await page.evaluate("window.loadedOnce = true")
    await _pull(page, "Release", "too soon", "Release refused: dead-lettered")
    await expect(page.locator("#status-badge")).to_have_text("QUARANTINED")
    await screenshot(page, "morning-release-refused")
    await restart(stack, "orchestrator")  # the fix: version 2 deployed again
    await _pull(page, "Release", "version 2 redeployed", "Release applied")
    # On it goes, live, to its itinerary, which waits on the notification worker (below).
    await expect(page.locator("#timeline tr.SagaReleased")).to_have_count(1, timeout=SETTLE_S * 1000)
    await expect(page.locator("#status-badge")).to_have_text("RUNNING")
    await expect(page.locator("form.lever[data-action=Release]")).to_have_count(0)
    await expect(page.locator("svg.dag g[data-step=send_itinerary]")).not_to_have_attribute(
        "data-status", "PENDING", timeout=SETTLE_S * 1000)
    assert await page.evaluate("window.loadedOnce") is True, "the page was reloaded"

    # The courier waiting for a person: booked by phone, answered from the deferred page.
    await _open_from_inbox(page, _item_of(console_url, "deferred", ids["ask"]), "answer")
    row = page.locator("table.deferred tr", has=page.locator(f"a:text-is('{ids['ask']}')"))
    await row.locator("input[name=detail]").fill("booked by phone")
    await row.locator("button").click()
    await expect(page.locator("#flash")).to_contain_text(f"for {OPERATOR}")
    await until(lambda: _status(console_url, ids["ask"]) == "COMPLETED", "the answered checkout")

    # The notification worker is started again (the deploy is outside the console); the wedged trips go on.
    await restart(stack, "notification")
    await until(lambda: not any(item["kind"] in ("unattended", "wedged") for item in _inbox(console_url)),
                "the notification topic attended and the wedged trips moving", timeout_s=SETTLE_S)
    for role in ("wedged0", "wedged1", "quarantined"):
        await until(lambda role=role: _status(console_url, ids[role]) == "COMPLETED", f"{role} completed")

    # What is left are dead letters: each one's cause is handled above; each is dismissed with why.
    letters = [item for item in _inbox(console_url) if item["kind"] == "dead_letter"]
    assert letters, _inbox(console_url)
    for item in letters:
        await _open_from_inbox(page, str(item["item_id"]), "dead letter")
        row = page.locator("table.letters tbody tr[data-position]").first
        await row.locator("form.dismiss input[name=reason]").fill("handled from the inbox")
        await row.locator("form.dismiss button").click()
        await expect(page.locator("#flash")).to_contain_text("dismissed")

    await page.goto("/inbox")
    await expect(page.locator("table.inbox td.empty")).to_have_text("nothing needs a human")
    await expect(page.locator("nav a.inbox")).to_have_text("Inbox")  # the badge is gone too
    await screenshot(page, "morning-inbox-empty")
    assert _inbox(console_url) == []


def _item_of(console_url: str, kind: str, saga_id: str) -> str:
    """The id of the inbox's one item of ``kind`` about ``saga_id``."""
    [item] = [item for item in _inbox(console_url) if item["kind"] == kind and item.get("saga_id") == saga_id]
    return str(item["item_id"])
