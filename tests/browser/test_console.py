"""The console in a real Chromium over the real services: the fleet by state, a search by customer id, a
Slowtown trip cancelled from its page and its SagaCancelled shown live, a card's retry pulled forward."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from playwright.async_api import Page, expect

from saga_orchestrator.client import SagaClient
from saga_orchestrator.participants.trip.scenarios import DEMO_MIX, SCENARIOS
from tests.browser.conftest import OPERATOR, SETTLE_S, accepting_dialogs, api, history, screenshot, until
from tests.e2e.harness import Stack

pytestmark = pytest.mark.e2e
WAITING = frozenset({"card_flaky"})  # its card's next attempt is an hour away (console_trip.py)


@pytest.fixture(scope="module")
async def demo(stack: Stack, console_url: str) -> dict[str, str]:
    """The demo's twenty trips started (saga id → scenario), and settled: each ended, or waits on its card."""
    started: dict[str, str] = {}
    async with SagaClient.from_settings(stack.settings) as client:
        for name, count in DEMO_MIX:
            if name == "cancelled":
                continue  # cancelled by hand in its own test
            for _ in range(count):
                saga_id = f"{name}-{uuid.uuid4().hex[:6]}"
                await client.start("trip", saga_id, SCENARIOS[name].trip(saga_id))
                started[saga_id] = name

    def settled() -> bool:
        rows = {row["saga_id"]: row for row in api(console_url, "/sagas?limit=1000")}
        return len(rows) >= len(started) and all(
            rows[saga_id]["status"] != "RUNNING" or (name in WAITING and rows[saga_id]["current_step"] == "charge_card"
                                                     and rows[saga_id]["step_failures"] >= 1)
            for saga_id, name in started.items() if saga_id in rows)

    await until(settled, "the demo's trips to settle")
    return started


def _expected_states(started: dict[str, str], console_url: str) -> Counter[str]:
    """Each trip's status as its scenario allows it; where a scenario allows two endings (a step withdrawn
    before it ran, or not), the one the saga took, as the API reports it."""
    ends = {"SagaCompleted": "COMPLETED", "SagaCompensated": "COMPENSATED",
            "SagaCompensationFailed": "COMPENSATION_FAILED"}
    status = {row["saga_id"]: row["status"] for row in api(console_url, "/sagas?limit=1000")}

    def expected(saga_id: str, name: str) -> str:
        if name in WAITING:
            return "RUNNING"
        allowed = {ends[terminal] for terminal in SCENARIOS[name].may_end_as()}
        return status[saga_id] if status.get(saga_id) in allowed else ends[SCENARIOS[name].terminal]
    return Counter(expected(saga_id, name) for saga_id, name in started.items())


async def test_the_fleet_page_shows_the_demos_sagas_by_state(page: Page, demo: dict[str, str],
                                                             console_url: str) -> None:
    await page.goto("/")
    expected = _expected_states(demo, console_url)
    for status, count in expected.items():
        await expect(page.locator(f"[data-status-count={status}]")).to_have_text(str(count))
    assert await page.locator("table.heat tbody tr").count() == len(expected)  # one row per (trip, state)
    oldest = page.locator("table.sagas tbody tr[data-saga]")
    assert await oldest.count() == sum(1 for name in demo.values() if name in WAITING)
    await screenshot(page, "fleet")


async def test_searching_a_customer_id_finds_its_trip(page: Page, demo: dict[str, str]) -> None:
    saga_id = next(saga_id for saga_id, name in demo.items() if name == "happy")
    await page.goto("/")
    await page.fill("header input[name=q]", f"cust_{saga_id}")
    await page.press("header input[name=q]", "Enter")
    rows = page.locator("table.sagas tbody tr[data-saga]")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_have_attribute("data-saga", saga_id)
    await rows.first.locator("a").click()
    await expect(page.locator("h1")).to_have_text(saga_id)
    await expect(page.locator("#status-badge")).to_have_text("COMPLETED")
    await expect(page.locator("svg.dag g[data-step=charge_card]")).to_have_attribute("data-status", "SUCCEEDED")
    await screenshot(page, "saga")


async def test_a_slowtown_trip_is_cancelled_from_its_page_and_shows_it_live(
        page: Page, stack: Stack, console_url: str, demo: dict[str, str]) -> None:
    saga_id = f"slowtown-{uuid.uuid4().hex[:6]}"
    # Its hotel answers late (1.2 s) and its card fails once, then waits an hour to be tried again: the pivot is
    # not passed while the test pulls the lever, however slow the machine.
    trip = {**SCENARIOS["cancelled"].trip(saga_id), "card_token": "tok_flaky"}
    async with SagaClient.from_settings(stack.settings) as client:
        await client.start("trip", saga_id, trip)
    await until(lambda: any(e["type"] == "StepCommandSent" and e["fields"].get("step") == "book_hotel"
                             for e in history(console_url, saga_id)), "the hotel's command")
    await page.goto(f"/sagas/{saga_id}")
    await page.evaluate("window.loadedOnce = true")  # gone if the page reloads
    asked = accepting_dialogs(page)
    lever = page.locator("form.lever[data-action=Cancel]")
    await lever.locator("input[name=reason]").fill("the customer called")
    await lever.locator("button").click()
    await expect(page.locator("#flash")).to_contain_text("Cancel applied", timeout=SETTLE_S * 1000)
    await expect(page.locator("#timeline tr.SagaCancelled")).to_have_count(1, timeout=SETTLE_S * 1000)
    await expect(page.locator("#status-badge")).to_have_text("CANCELLED")
    assert await page.evaluate("window.loadedOnce") is True, "the page was reloaded"
    assert len(asked) == 1 and "Undone: book_flight" in asked[0] and "Still in flight" in asked[0], asked
    requested = next(e for e in history(console_url, saga_id) if e["type"] == "SagaCancelRequested")
    assert requested["fields"]["operator"] == OPERATOR and requested["fields"]["reason"] == "the customer called"
    assert any(entry["operator"] == OPERATOR and entry["action"] == "Cancel" and entry["target"] == f"saga {saga_id}"
               for entry in api(console_url, "/audit"))
    await screenshot(page, "cancelled")


async def test_a_card_waiting_on_its_retry_is_retried_now(page: Page, console_url: str,
                                                          demo: dict[str, str]) -> None:
    saga_id = next(saga_id for saga_id, name in demo.items() if name == "card_flaky")
    await page.goto(f"/sagas/{saga_id}")
    await expect(page.locator("svg.dag g[data-step=charge_card]")).to_have_attribute("data-status", "RETRY_SCHEDULED")
    retry_now = page.locator("form.lever[data-action='RetryNow:charge_card'] button")
    # The flaky card fails its first FLAKY_FAILURES attempts: the first retry now fails too and waits an hour
    # again, which the live timeline shows; the second goes through.
    await retry_now.click()
    await expect(page.locator("#timeline tr.StepRetryScheduled")).to_have_count(2, timeout=SETTLE_S * 1000)
    await retry_now.click()
    await expect(page.locator("#timeline tr.SagaCompleted")).to_have_count(1, timeout=SETTLE_S * 1000)
    actions = [e["fields"] for e in history(console_url, saga_id) if e["type"] == "OperatorAction"]
    assert actions == [{"definition_version": 1, "action": "RetryNow", "operator": OPERATOR,
                        "detail": "charge_card"}] * 2




async def test_a_retry_loop_stays_one_row_while_the_page_watches_it(page: Page, stack: Stack,
                                                                     console_url: str) -> None:
    saga_id = f"bounce-{uuid.uuid4().hex[:6]}"
    # Its mailbox is unavailable for the itinerary's first three attempts, retried within a few seconds.
    async with SagaClient.from_settings(stack.settings) as client:
        await client.start("trip", saga_id, SCENARIOS["email_bounce"].trip(saga_id))
    await until(lambda: bool(history(console_url, saga_id)), "the saga's start")
    await page.goto(f"/sagas/{saga_id}")
    await page.evaluate("window.loadedOnce = true")  # gone if the page reloads
    # The retries' backoffs alone take over a second: the page is drawn before the loop ends, the stream draws it.
    assert await page.locator("#timeline tr.SagaCompleted").count() == 0
    await expect(page.locator("#timeline tr.SagaCompleted")).to_have_count(1, timeout=SETTLE_S * 1000)
    loop = page.locator("#timeline tr.RetryLoop")
    await expect(loop).to_have_count(1)
    await expect(loop).to_contain_text("attempts 1\u20133, MailboxUnavailable")
    assert (await loop.get_attribute("id") or "").startswith("loop-send_itinerary-")
    await expect(page.locator("#timeline tr.StepFailed")).to_have_count(0)
    assert await page.evaluate("window.loadedOnce") is True, "the page was reloaded"


async def test_a_paused_trip_offers_unpause_without_a_reload_over_the_shared_stream(
        page: Page, stack: Stack, console_url: str) -> None:
    saga_id = f"paused-{uuid.uuid4().hex[:6]}"
    trip = {**SCENARIOS["happy"].trip(saga_id), "card_token": "tok_flaky"}  # its card waits an hour to retry
    async with SagaClient.from_settings(stack.settings) as client:
        await client.start("trip", saga_id, trip)
    await until(lambda: any(e["type"] == "StepRetryScheduled" for e in history(console_url, saga_id)),
                "the card's retry")
    await page.add_init_script("""window.streams = 0; const Opened = window.EventSource;
        window.EventSource = class extends Opened { constructor(...args) { super(...args); window.streams++; } };""")
    await page.goto(f"/sagas/{saga_id}")
    await page.evaluate("window.loadedOnce = true")  # gone if the page reloads
    await page.locator("form.lever[data-action=Pause] button").click()
    await expect(page.locator("#flash")).to_contain_text("Pause applied", timeout=SETTLE_S * 1000)
    await expect(page.locator("form.lever[data-action=Unpause]")).to_have_count(1)
    await expect(page.locator("form.lever[data-action=Pause]")).to_have_count(0)
    await expect(page.locator("#saga-status")).to_contain_text("PAUSED")
    await page.locator("form.lever[data-action=Unpause] button").click()
    await expect(page.locator("#flash")).to_contain_text("Unpause applied", timeout=SETTLE_S * 1000)
    await expect(page.locator("form.lever[data-action=Pause]")).to_have_count(1)
    # Terminate asks first, saying what stays done; accepted, the saga ends (and leaves the bulk test's count).
    asked = accepting_dialogs(page)
    lever = page.locator("form.lever[data-action=Terminate]")
    await lever.locator("input[name=reason]").fill("refunded by hand")
    await lever.locator("button").click()
    await expect(page.locator("#flash")).to_contain_text("Terminate applied", timeout=SETTLE_S * 1000)
    await expect(page.locator("#status-badge")).to_have_text("TERMINATED")
    assert len(asked) == 1 and "nothing is undone" in asked[0] and "book_flight" in asked[0], asked
    assert await page.evaluate("window.loadedOnce") is True, "the page was reloaded"
    # The page holds no stream of its own: the browser's one stream, shared by its tabs, is in its shared worker.
    assert await page.evaluate("window.streams") == 0


async def test_a_bulk_dry_run_counts_then_the_job_runs(page: Page, stack: Stack, console_url: str,
                                                      demo: dict[str, str]) -> None:
    async with SagaClient.from_settings(stack.settings) as client:
        for _ in range(3):
            saga_id = f"bulk-{uuid.uuid4().hex[:6]}"
            await client.start("trip", saga_id, SCENARIOS["card_flaky"].trip(saga_id))

    def waiting_on_the_card() -> list[str]:
        rows = api(console_url, "/sagas?status=RUNNING&limit=1000")
        return sorted(row["saga_id"] for row in rows if row["last_error"] == "CardNetworkTimeout")

    await until(lambda: len(waiting_on_the_card()) >= 4, "the new flaky cards to wait on their retry")
    chosen = waiting_on_the_card()  # the three, and the demo's flaky card the retry test left waiting
    await page.goto("/bulk")
    await page.select_option("select[name=saga_type]", "trip")
    await page.check("input[name=statuses][value=RUNNING]")
    await page.fill("input[name=error]", "CardNetworkTimeout")
    await page.click("#count")
    await expect(page.locator("#bulk-count [data-count]")).to_have_attribute("data-count", str(len(chosen)))
    await expect(page.locator("#bulk-count")).to_contain_text(chosen[0])
    await page.select_option("select[name=action]", "Terminate")
    await page.fill("input[name=reason]", "refunded by hand")
    await page.fill("input[name=rate_per_s]", "5")
    asked = accepting_dialogs(page)
    await page.click("#start")
    await expect(page.locator("#flash")).to_contain_text(f"started for {OPERATOR}: {len(chosen)} sagas")
    assert len(asked) == 1 and asked[0].startswith(f"Terminate {len(chosen)} sagas? ") \
        and "nothing is undone" in asked[0], asked
    job = page.locator("#jobs tr[data-job]").first
    await expect(job.locator("[data-job-status]")).to_have_text("DONE", timeout=SETTLE_S * 1000)
    await expect(job.locator("[data-job-done]")).to_have_text(f"{len(chosen)} of {len(chosen)}")
    await screenshot(page, "bulk")
    for saga_id in chosen:
        await until(lambda saga_id=saga_id: api(console_url, f"/sagas/{saga_id}")["status"] == "TERMINATED",
                     f"{saga_id} terminated")
        action = next(e for e in history(console_url, saga_id) if e["type"] == "OperatorAction")
        assert action["fields"]["operator"].startswith(f"{OPERATOR} (bulk job ")
    assert any(entry["action"] == "BulkJob Terminate" and entry["outcome"] == f"started: {len(chosen)} sagas"
               for entry in api(console_url, "/audit"))
