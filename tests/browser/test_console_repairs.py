"""Repairs from the console in a real Chromium over the real services: a start dead-lettered before its saga type
was deployed is replayed from the dead-letter page and runs; a saga quarantined by a rollback of its version is
released from its page once the version is back, and completes live."""

from __future__ import annotations

import uuid

import pytest
from playwright.async_api import Page, expect

from saga_orchestrator.client import SagaClient
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas.topics import Topics
from tests.browser.conftest import OPERATOR, SETTLE_S, api, history, screenshot, until
from tests.browser.repairs_trip import BOTH_VERSIONS, DEPLOYED, TRIP_V1
from tests.chaos.crash_tools import restart
from tests.e2e.harness import Stack

pytestmark = pytest.mark.e2e
SAGA_DEFINITIONS = DEPLOYED  # the stack's and the console's (conftest.py); a test restarts the orchestrator
# with less, and with all of it again as the fix


def _status(console_url: str, saga_id: str) -> str | None:
    rows = api(console_url, f"/search?q={saga_id}")
    return rows[0]["status"] if rows else None


async def test_a_start_dead_lettered_before_its_type_was_deployed_is_replayed_and_runs(
        page: Page, stack: Stack, console_url: str) -> None:
    saga_id = f"holiday-{uuid.uuid4().hex[:6]}"
    await restart(stack, "orchestrator", {"SAGA_DEFINITIONS": BOTH_VERSIONS})  # holiday is not deployed yet
    async with SagaClient.from_settings(stack.settings) as client:  # it knows holiday; the orchestrator does not yet
        await client.start("holiday", saga_id, SCENARIOS["happy"].trip(saga_id))
    [letter] = await until(lambda: [item for item in api(console_url, "/dead-letters")
                                    if item.get("saga_id") == saga_id], "the start's dead letter")
    assert "unknown saga_type 'holiday'" in letter["reason"]
    await restart(stack, "orchestrator", {"SAGA_DEFINITIONS": DEPLOYED})  # the fix: holiday deployed

    await page.goto("/dead-letters")
    row = page.locator(f"table.letters tr[data-position='{letter['position']}']")
    await expect(row).to_contain_text(Topics(stack.settings.saga_topic_prefix).start)
    await expect(row.locator("a")).to_have_text(saga_id)
    await expect(row.locator(".status")).to_have_text("REJECTED")
    await expect(row.locator("input[name=force]")).to_have_count(0)  # a start, not a step's message
    await row.locator("form.replay input[name=reason]").fill("holiday deployed")
    await row.locator("form.replay button").click()
    await expect(page.locator("#flash")).to_contain_text(f"{letter['position']} replayed to "
                                                         f"{letter['source_topic']} by {OPERATOR}")
    await screenshot(page, "dead-letters")

    await row.locator("a").click()
    await expect(page.locator("h1")).to_have_text(saga_id)
    await expect(page.locator("#timeline tr.SagaCompleted")).to_have_count(1, timeout=SETTLE_S * 1000)
    await expect(page.locator("#status-badge")).to_have_text("COMPLETED")
    [replayed] = [e["fields"] for e in history(console_url, saga_id) if e["type"] == "OperatorAction"]
    assert (replayed["action"], replayed["operator"]) == ("DlqReplay", OPERATOR)
    assert replayed["detail"].startswith(f"letter {letter['position']} from ")
    assert replayed["detail"].endswith(": holiday deployed")
    assert any(entry["operator"] == OPERATOR and entry["action"] == "DlqReplay"
               and entry["target"] == f"dead letter {letter['position']}" and entry["outcome"].startswith("published")
               for entry in api(console_url, "/audit"))
    await page.goto("/dead-letters")
    await expect(row.locator("td.replays")).to_contain_text(f"by {OPERATOR}")


async def test_a_saga_quarantined_by_a_rollback_is_released_from_its_page(
        page: Page, stack: Stack, console_url: str) -> None:
    saga_id = f"v2-{uuid.uuid4().hex[:6]}"
    async with SagaClient.from_settings(stack.settings) as client:
        await client.start("trip", saga_id, SCENARIOS["cancelled"].trip(saga_id))  # Slowtown: a slow hotel
    await until(lambda: any(e["type"] == "StepCommandSent" and e["fields"].get("step") == "book_hotel"
                            for e in history(console_url, saga_id)), "the hotel's command")
    assert history(console_url, saga_id)[0]["fields"]["definition_version"] == 2
    # Rolled back while the hotel books, forced over the check at start that would refuse it.
    await restart(stack, "orchestrator", {"SAGA_DEFINITIONS": TRIP_V1, "SAGA_ALLOW_STRANDING": "true"})
    await until(lambda: _status(console_url, saga_id) == "QUARANTINED", "the quarantine")

    await page.goto("/quarantine")
    await expect(page.locator(f"table.sagas tr[data-saga='{saga_id}'] .status")).to_have_text("QUARANTINED")
    await screenshot(page, "quarantine")
    await page.locator(f"table.sagas tr[data-saga='{saga_id}'] a").click()
    await expect(page.locator("#status-badge")).to_have_text("QUARANTINED")
    lever = page.locator("form.lever[data-action=Release]")
    await lever.locator("input[name=reason]").fill("too soon")
    await lever.locator("button").click()  # before the fix: the orchestrator dead-letters it, the page says why
    await expect(page.locator("#flash p.error")).to_contain_text(
        "Release refused: dead-lettered: the orchestrator still cannot run the saga", timeout=SETTLE_S * 1000)
    await restart(stack, "orchestrator", {"SAGA_DEFINITIONS": DEPLOYED})  # version 2 is back
    await lever.locator("input[name=reason]").fill("version 2 redeployed")
    await lever.locator("button").click()
    await expect(page.locator("#flash")).to_contain_text("Release applied", timeout=SETTLE_S * 1000)
    await expect(page.locator("#timeline tr.SagaReleased")).to_have_count(1, timeout=SETTLE_S * 1000)
    await expect(page.locator("#timeline tr.SagaCompleted")).to_have_count(1, timeout=SETTLE_S * 1000)
    await expect(page.locator("#status-badge")).to_have_text("COMPLETED")
    [released] = [e["fields"] for e in history(console_url, saga_id) if e["type"] == "SagaReleased"]
    assert released["operator"] == OPERATOR
